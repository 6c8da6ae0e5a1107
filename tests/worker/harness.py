"""Running workers in tests: in a thread (to look inside) or as a real `python -m worker` process
(where process death matters), submitting jobs with plain XADDs and reading result streams back."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import redis

from tests.redis_server import RedisServer
from worker.loop import Worker
from worker.protocol import DEFAULT_CANCEL_TTL_S, Keys, ResultEvent, decode_event, is_complete, seq_from_stream_id
from worker.settings import WorkerSettings

REPO_ROOT = Path(__file__).resolve().parents[2]

# Fast timings for tests: leases renewed every 0.5 s, dead workers' messages claimed after 1.5 s.
TEST_SETTINGS = dict(
    device="cpu",
    dtype="float32",
    num_kv_tokens=4096,
    max_model_len=256,
    max_num_seqs=32,
    metrics_port=0,
    batch_window_ms=0.0,
    idle_block_ms=50,
    lease_ms=1500,
    claim_interval_ms=200,
    heartbeat_interval_s=0.2,
    heartbeat_ttl_s=2,
    shutdown_grace_s=5.0,
    log_level="INFO",
)


def make_settings(server: RedisServer, prefix: str, model_dir: Path, **overrides) -> WorkerSettings:
    values = {**TEST_SETTINGS, "redis_url": server.url, "prefix": prefix, "model": str(model_dir), **overrides}
    return WorkerSettings(**values)


class ThreadWorker:
    """A Worker running in a thread of the test process (its engine and step log are inspectable)."""

    def __init__(self, settings: WorkerSettings, engine=None) -> None:
        self.worker = Worker(settings, engine=engine)
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name="test-worker", daemon=True)

    def _run(self) -> None:
        try:
            self.worker.run()
        except BaseException as exc:  # surfaced by stop()
            self.error = exc
            raise

    def __enter__(self) -> ThreadWorker:
        self.thread.start()
        if not self.worker.ready.wait(timeout=30):
            raise TimeoutError("worker did not start")
        return self

    def stop(self, *, force: bool = False, timeout_s: float = 30) -> None:
        self.worker.request_stop(force=force)
        self.thread.join(timeout=timeout_s)
        if self.thread.is_alive():
            raise TimeoutError("worker did not stop")
        if self.error is not None:
            raise self.error

    def __exit__(self, *exc_info) -> None:
        self.stop(force=True)


class ProcessWorker:
    """`python -m worker` as a child process with flags built from settings; logs go to a file."""

    def __init__(self, settings: WorkerSettings, log_path: Path, *, consumer: str | None = None) -> None:
        args = [sys.executable, "-m", "worker"]
        fields = settings.model_dump(exclude_none=True)
        if consumer:
            fields["consumer"] = consumer
        for name, value in fields.items():
            flag = "--" + name.replace("_", "-")
            if isinstance(value, bool):
                args.append(flag if value else "--no-" + name.replace("_", "-"))
            else:
                args += [flag, str(value)]
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO_ROOT), "HF_HUB_OFFLINE": "1"}
        self.log_path = log_path
        self.log = open(log_path, "wb")  # noqa: SIM115 (closed in wait/kill)
        self.process = subprocess.Popen(args, cwd=REPO_ROOT, env=env, stdout=self.log, stderr=subprocess.STDOUT)
        self.consumer = consumer

    def log_text(self) -> str:
        self.log.flush()
        return self.log_path.read_text(errors="replace")

    def wait_ready(self, client: redis.Redis, keys: Keys, timeout_s: float = 90) -> str:
        """Wait for the heartbeat key; returns the consumer name."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"worker exited with {self.process.returncode}:\n{self.log_text()[-4000:]}")
            for key in client.scan_iter(match=keys.worker_pattern):
                beat = json.loads(client.get(key) or b"{}")
                if beat.get("consumer") and (self.consumer is None or beat["consumer"] == self.consumer):
                    if self.consumer is None and f"-{self.process.pid}-" not in beat["consumer"]:
                        continue
                    self.consumer = beat["consumer"]
                    return self.consumer
            time.sleep(0.1)
        raise TimeoutError(f"worker not ready after {timeout_s}s:\n{self.log_text()[-4000:]}")

    def kill(self) -> None:
        self.process.send_signal(signal.SIGKILL)
        self.process.wait()
        self.log.close()

    def terminate(self, timeout_s: float = 30) -> int:
        self.process.send_signal(signal.SIGTERM)
        code = self.process.wait(timeout=timeout_s)
        self.log.close()
        return code

    def __enter__(self) -> ProcessWorker:
        return self

    def __exit__(self, *exc_info) -> None:
        if self.process.poll() is None:
            self.kill()


def submit(client: redis.Redis, keys: Keys, request_id: str, **fields) -> str:
    """XADD a request with plain fields (JSON-encoding lists and dicts), as any language would."""
    values = {"v": "1", "id": request_id}
    for name, value in fields.items():
        values[name] = json.dumps(value) if isinstance(value, (list, dict)) else str(value)
    return client.xadd(keys.requests, values).decode()


def read_events(client: redis.Redis, keys: Keys, request_id: str) -> list[tuple[int, ResultEvent]]:
    return [(seq_from_stream_id(i), decode_event(f)) for i, f in client.xrange(keys.result(request_id), "-", "+")]


def wait_complete(
    client: redis.Redis, keys: Keys, request_ids: list[str], *, n: int = 1, timeout_s: float = 60
) -> dict[str, list[ResultEvent]]:
    """Poll the result streams until every request is complete; returns their events in seq order."""
    deadline = time.monotonic() + timeout_s
    pending = set(request_ids)
    results: dict[str, list[ResultEvent]] = {}
    while pending:
        for request_id in list(pending):
            events = [event for _, event in read_events(client, keys, request_id)]
            if is_complete(events, n):
                results[request_id] = events
                pending.discard(request_id)
        if pending and time.monotonic() > deadline:
            raise TimeoutError(f"{len(pending)} request(s) incomplete after {timeout_s}s: {sorted(pending)[:5]}")
        time.sleep(0.05)
    return results


def tokens_by_index(events: list[ResultEvent]) -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for event in events:
        if event.type == "token":
            out.setdefault(event.index, []).extend(event.token_ids)
    return out


def assert_exactly_once(client: redis.Redis, keys: Keys, request_id: str, n: int = 1) -> list[ResultEvent]:
    """The stream holds seq 1..K once each, nothing after the terminal events; returns the events."""
    entries = read_events(client, keys, request_id)
    seqs = [seq for seq, _ in entries]
    assert seqs == list(range(1, len(seqs) + 1)), f"{request_id}: seqs {seqs}"
    events = [event for _, event in entries]
    assert [event.seq for event in events] == seqs
    done = [event for event in events if event.type == "done"]
    assert sorted(event.index for event in done) == list(range(n)), f"{request_id}: done events {done}"
    last_token_seq = {}
    for event in events:
        if event.type == "token":
            last_token_seq[event.index] = event.seq
    for event in done:
        assert last_token_seq.get(event.index, 0) < event.seq, f"{request_id}: tokens after done"
    return events


def offline_outputs(engine, requests: dict[str, tuple[list[int], dict]]) -> dict[str, dict[int, list[int]]]:
    """The engine run directly on the same requests: request id -> choice index -> tokens."""
    from engine.sampling_params import SamplingParams

    for request_id, (prompt_ids, params) in requests.items():
        engine.add_request(request_id, prompt_ids, SamplingParams(**params))
    out: dict[str, dict[int, list[int]]] = {rid: {} for rid in requests}
    while engine.has_unfinished_requests():
        for output in engine.step():
            out[output.request_id].setdefault(output.index, []).extend(output.new_token_ids)
    return out


def request_cancel(client, keys: Keys, request_id: str, ttl_s: int = DEFAULT_CANCEL_TTL_S) -> None:
    """What a submitter does to cancel a request (the API does the same, api/attachments.py): the
    cancel key, then the counter that makes workers read cancel keys (worker/cancel.py)."""
    with client.pipeline(transaction=True) as pipe:
        pipe.set(keys.cancel(request_id), "1", ex=ttl_s)
        pipe.incr(keys.cancels)
        pipe.execute()
