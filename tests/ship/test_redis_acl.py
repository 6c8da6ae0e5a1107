"""The Redis of docker-compose.yml: its ACL grants the API and the worker what their code uses, and
nothing more; its redis.conf holds (AOF everysec, noeviction).

A real redis-server starts from docker/redis/redis.conf with the ACL file rendered by the same
script the container runs; the real worker and the real API then serve requests as the restricted
users, and Redis's own ACL LOG must show no refusal. Commands outside the grant are refused.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from api.settings import ApiSettings
from tests.api.servers import API_KEY, ThreadApi
from tests.api.wire import chunks, parse_sse
from tests.batch.stack import BatchWorkerProcess, batch_settings, openai_client, wait_batch
from tests.redis_server import RedisServer, free_port
from tests.ship.dockerfiles import compose_config
from tests.ship.redis_acl import (
    BATCH_STORES,
    KOMBU_CONSUME,
    KOMBU_PUBLISH,
    PASSWORDS,
    REDIS_CONF,
    REDIS_DIR,
    commands_used,
    granted_commands,
    render,
)
from tests.ship.stack import child_env
from tests.worker.harness import ThreadWorker, make_settings, submit, wait_complete
from worker.lease import LeaseKeeper
from worker.protocol import Keys
from worker.stream_reader import StreamReader

PREFIX = "inferq"  # the ACL names keys under the default prefix
KEYS = Keys(PREFIX)


def _url(server: RedisServer, user: str) -> str:
    password = PASSWORDS[f"INFERQ_REDIS_{user.upper()}_PASSWORD"]
    return f"redis://{user}:{password}@127.0.0.1:{server.port}/0"


def _healthcheck(env: dict[str, str]) -> subprocess.CompletedProcess:
    """`python -m worker.healthcheck`, the worker container's HEALTHCHECK."""
    return subprocess.run([sys.executable, "-m", "worker.healthcheck"], env=env, capture_output=True, text=True)


@pytest.fixture(scope="module")
def acl_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("acl") / "users.acl"
    result = render(path)
    assert result.returncode == 0, result.stderr
    return path


@pytest.fixture(scope="module")
def acl_server(acl_file: Path) -> Iterator[RedisServer]:
    admin_password = PASSWORDS["INFERQ_REDIS_ADMIN_PASSWORD"]
    server = RedisServer(
        config_file=REDIS_CONF, extra_args=["--aclfile", str(acl_file)], username="admin", password=admin_password
    )
    with server:
        yield server


@pytest.fixture
def admin(acl_server: RedisServer) -> Iterator[redis.Redis]:
    """The admin user (str replies); the log of refusals starts empty."""
    client = acl_server.client(decode_responses=True)
    client.acl_log_reset()
    yield client
    client.close()


@pytest.fixture
def admin_bytes(acl_server: RedisServer) -> Iterator[redis.Redis]:
    """The admin user with bytes replies, as tests.worker.harness expects."""
    client = acl_server.client()
    yield client
    client.close()


def test_render_needs_every_password_and_refuses_unsafe_ones(tmp_path: Path) -> None:
    missing = {k: v for k, v in PASSWORDS.items() if k != "INFERQ_REDIS_WORKER_PASSWORD"}
    result = render(tmp_path / "a.acl", missing)
    assert result.returncode != 0 and "INFERQ_REDIS_WORKER_PASSWORD is not set" in result.stderr
    assert not (tmp_path / "a.acl").exists()
    unsafe = {**PASSWORDS, "INFERQ_REDIS_API_PASSWORD": "has space@and:colon"}
    result = render(tmp_path / "b.acl", unsafe)
    assert result.returncode != 0 and "INFERQ_REDIS_API_PASSWORD may hold only" in result.stderr
    assert not (tmp_path / "b.acl").exists()


def test_redis_conf_is_in_force(admin: redis.Redis) -> None:
    assert admin.config_get("appendonly") == {"appendonly": "yes"}
    assert admin.config_get("appendfsync") == {"appendfsync": "everysec"}
    assert admin.config_get("maxmemory-policy") == {"maxmemory-policy": "noeviction"}
    assert set(admin.acl_users()) == {"default", "healthcheck", "admin", "api", "worker", "batch"}
    assert "off" in admin.acl_getuser("default")["flags"]


def test_grants_equal_the_commands_the_code_sends(acl_file: Path) -> None:
    grants = granted_commands(acl_file.read_text())
    code = {
        "api": commands_used("api", BATCH_STORES),
        "worker": commands_used("worker"),
        "batch": commands_used("batch"),
    }
    code["api"][0].update(KOMBU_PUBLISH)
    code["batch"][0].update(KOMBU_CONSUME)
    for user, package in (("api", "api"), ("worker", "worker"), ("batch", "batch")):
        used, unknown = code[user]
        assert not unknown, f"{package}/ calls redis methods the ACL test does not know: {unknown}"
        assert used - grants[user] == set(), f"{package}/ sends commands user {user!r} may not run"
        assert grants[user] - used == set(), f"user {user!r} may run commands {package}/ never sends"
    assert grants["healthcheck"] == {"ping"}


def test_unauthenticated_and_healthcheck_users_can_do_nothing_else(acl_server: RedisServer) -> None:
    anonymous = acl_server.client(username=None, password=None, retry=Retry(NoBackoff(), 0))
    with anonymous, pytest.raises(redis.AuthenticationError):
        anonymous.ping()
    # The compose healthcheck logs in as "healthcheck" with any password (nopass) and may only PING.
    with acl_server.client(username="healthcheck", password="x", decode_responses=True) as health:
        assert health.ping() is True
        with pytest.raises(redis.exceptions.NoPermissionError):
            health.get(KEYS.model)


def _stream(api: ThreadApi, body: dict, headers: dict | None = None) -> list[dict]:
    with api.client(headers=headers, timeout=60) as http:
        response = http.post("/v1/chat/completions", json={**body, "stream": True})
    assert response.status_code == 200, response.text
    return parse_sse(response.text)


def test_worker_and_api_serve_as_restricted_users(
    acl_server: RedisServer, admin: redis.Redis, admin_bytes: redis.Redis, tiny_llama_dir: Path
) -> None:
    worker_url, api_url = _url(acl_server, "worker"), _url(acl_server, "api")
    worker_client = redis.Redis.from_url(worker_url)

    # A stream reader of its own (as the worker user) holds one message first: the running worker must
    # take it over once its lease lapses (XAUTOCLAIM), after the probe renewed it (Lua XCLAIM).
    probe = StreamReader(worker_client, KEYS, "acl-probe", lease_ms=1500)
    probe.ensure_group()
    submit(admin_bytes, KEYS, "claimed-1", prompt="hello", params={"max_tokens": 4, "temperature": 0})
    (delivery,) = probe.read_new(1, None)
    leases = LeaseKeeper(worker_client, KEYS, "acl-probe", 1500, held=list, on_lost=lambda ids: None)
    assert leases.renew([delivery.message_id]) == []
    assert [d.message_id for d in probe.read_own_pending(10)] == [delivery.message_id]

    settings = make_settings(acl_server, PREFIX, tiny_llama_dir, redis_url=worker_url)
    api_settings = ApiSettings(
        redis_url=api_url, prefix=PREFIX, api_keys=[API_KEY], resume_grace_s=0.3, rate_limit_rpm=1000,
        rate_limit_tpm=10_000_000,
    )  # fmt: skip
    with ThreadWorker(settings) as worker:
        api = ThreadApi(api_settings).start()
        try:
            with api.client() as http:
                assert http.get("/ready").status_code == 200  # SCAN + GET of heartbeats
                assert http.get("/v1/models").json()["data"], "the model the worker published"
                assert http.get("/metrics").status_code == 200  # queue depth: ZCARD + HVALS
                body = {"model": settings.model_name, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 6}
                first = http.post("/v1/chat/completions", json=body, headers={"Idempotency-Key": "k1"})
                again = http.post("/v1/chat/completions", json=body, headers={"Idempotency-Key": "k1"})
                assert first.status_code == again.status_code == 200, first.text
                assert first.json()["id"] == again.json()["id"]
                request_id = first.headers["X-Request-Id"]
                resumed = http.get(f"/v1/requests/{request_id}/stream", params={"last_event_id": 0})
                assert resumed.status_code == 200 and "[DONE]" in resumed.text  # XRANGE + SUBSCRIBE
                assert http.post(f"/v1/requests/{request_id}/cancel").json()["cancelled"] is False

                events = _stream(api, {**body, "stream_options": {"include_usage": True}})
                assert events[-1]["data"] == "[DONE]"
                assert chunks(events)[-1]["usage"]["completion_tokens"] >= 1

                # A cancel: the API sets the cancel key (as api), the worker reads it with MGET every
                # step (as worker) and ends the request with "abort".
                long_body = {**body, "max_tokens": 200, "stream": True, "ignore_eos": True}
                with http.stream("POST", "/v1/chat/completions", json=long_body) as response:
                    assert response.status_code == 200
                    cancelled_id = response.headers["X-Request-Id"]
                    next(response.iter_lines())
                    assert http.post(f"/v1/requests/{cancelled_id}/cancel").json()["cancelled"] is True
                events = wait_complete(admin_bytes, KEYS, [cancelled_id], timeout_s=30)[cancelled_id]
                assert events[-1].finish_reason == "abort"

            # A message no worker can parse goes to the dead-letter stream (XADD inferq:dead + XACK).
            admin.xadd(KEYS.requests, {"v": "1", "id": "broken-1", "prompt": ""})
            wait_complete(admin_bytes, KEYS, ["claimed-1"], timeout_s=30)
            deadline = time.monotonic() + 10
            while not admin.xlen(KEYS.dead) and time.monotonic() < deadline:
                time.sleep(0.05)
            assert [f["id"] for _, f in admin.xrange(KEYS.dead)] == ["broken-1"]

            # The container healthcheck, run as the worker user, finds this host's heartbeat.
            env = child_env(INFERQ_REDIS_URL=worker_url, INFERQ_PREFIX=PREFIX)
            check = _healthcheck(env)
            assert check.returncode == 0, check.stderr
            assert json.loads(check.stdout)["consumer"] == worker.worker.consumer
        finally:
            api.stop()
        # The trim the heartbeat runs every 30 s (XINFO GROUPS + XPENDING + XTRIM), as the worker user.
        assert probe.trim_acknowledged() >= 1
    worker_client.close()

    # Redis logs every refusal: none may have happened, even one the code retried or logged away.
    # NOTE: redis-py sends CLIENT SETINFO on connect and ignores a refusal; Redis >= 7.2 logs it.
    refusals = [e for e in admin.acl_log(count=100) if e["object"] != "client|setinfo"]
    assert refusals == [], refusals


@pytest.mark.parametrize(
    ("user", "command"),
    [
        ("api", ["FLUSHALL"]),
        ("api", ["KEYS", "*"]),
        ("api", ["CONFIG", "GET", "maxmemory"]),
        ("api", ["XREADGROUP", "GROUP", "inferq:workers", "x", "COUNT", "1", "STREAMS", "inferq:requests", ">"]),
        ("api", ["XADD", "inferq:result:x", "0-1", "type", "token"]),  # results are the worker's to write
        ("api", ["SET", "inferq:model", "{}"]),
        ("api", ["DEL", "inferq:requests"]),
        ("api", ["PUBLISH", "inferq:events:x", "{}"]),
        ("api", ["EVAL", "return 1", "0"]),
        ("api", ["GET", "other:key"]),
        ("worker", ["FLUSHDB"]),
        ("worker", ["XADD", "inferq:requests", "*", "v", "1"]),  # submitting is not the worker's job
        ("worker", ["SET", "inferq:cancel:x", "1"]),  # cancel keys are read-only to it
        ("worker", ["GET", "inferq:api:queue"]),
        ("worker", ["XGROUP", "DESTROY", "inferq:requests", "inferq:workers"]),
        ("worker", ["SCRIPT", "FLUSH"]),
        ("worker", ["SUBSCRIBE", "inferq:events:x"]),
        ("worker", ["XADD", "elsewhere:results", "*", "type", "token"]),
        ("batch", ["FLUSHALL"]),
        ("batch", ["XREADGROUP", "GROUP", "inferq:workers", "x", "COUNT", "1", "STREAMS", "inferq:requests", ">"]),
        ("batch", ["XADD", "inferq:result:x", "0-1", "type", "token"]),
        ("batch", ["SET", "inferq:model", "{}"]),
        ("batch", ["GET", "inferq:api:queue"]),
        ("batch", ["DEL", "inferq:requests"]),
        ("batch", ["HSET", "elsewhere:batch:x", "a", "1"]),
        ("batch", ["PUBLISH", "inferq:events:x", "{}"]),
    ],
)
def test_commands_outside_the_grant_are_refused(acl_server: RedisServer, user: str, command: list[str]) -> None:
    with redis.Redis.from_url(_url(acl_server, user)) as client, pytest.raises(redis.exceptions.NoPermissionError):
        client.execute_command(*command)


def test_scripts_run_with_the_callers_permissions(acl_server: RedisServer, admin: redis.Redis) -> None:
    """EVALSHA is granted for the code's own scripts; a script that calls anything else is refused inside."""
    sha = admin.script_load("return redis.call('FLUSHALL')")
    with redis.Redis.from_url(_url(acl_server, "worker")) as worker, pytest.raises(redis.ResponseError) as refused:
        worker.evalsha(sha, 1, KEYS.requests)
    assert "can't run this command" in str(refused.value)
    (entry,) = admin.acl_log(count=1)
    assert (entry["username"], entry["context"], entry["object"]) == ("worker", "lua", "flushall")
    admin.set("canary", "1")
    assert admin.get("canary") == "1"


def test_healthcheck_fails_without_a_heartbeat(acl_server: RedisServer, admin: redis.Redis) -> None:
    env = child_env(INFERQ_REDIS_URL=_url(acl_server, "worker"), INFERQ_PREFIX=PREFIX, INFERQ_CONSUMER="gone-1-abc")
    check = _healthcheck(env)
    assert check.returncode == 1 and "no heartbeat inferq:worker:gone-1-abc" in check.stderr
    # Another host's worker does not make this container healthy.
    admin.set(KEYS.worker("another-host-1-abc"), json.dumps({"consumer": "another-host-1-abc"}), ex=10)
    env.pop("INFERQ_CONSUMER")
    check = _healthcheck(env)
    assert check.returncode == 1, check.stdout
    bad = child_env(INFERQ_REDIS_URL=f"redis://worker:wrong@127.0.0.1:{acl_server.port}/0", INFERQ_PREFIX=PREFIX)
    check = _healthcheck(bad)
    assert check.returncode == 1 and "unhealthy: Redis" in check.stderr and "wrong" not in check.stderr


def test_start_script_renders_the_acl_and_starts_redis_that_passes_the_compose_healthcheck(tmp_path: Path) -> None:
    """docker/redis/start-redis.sh as the redis container runs it, with the image's entrypoint stood in for by
    a script that starts the real redis-server here (on a free port, in tmp_path) with the same arguments."""
    port = free_port()
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    entrypoint = bin_dir / "docker-entrypoint.sh"
    entrypoint.write_text(
        '#!/bin/sh\necho "$@" > "$TEST_DIR/argv"\n'
        'exec "$@" --port "$TEST_PORT" --bind 127.0.0.1 --dir "$TEST_DIR" --daemonize no --logfile "$TEST_DIR/log"\n'
    )
    entrypoint.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith("INFERQ_REDIS_")}
    env.update(
        PATH=f"{bin_dir}:{env['PATH']}", TEST_DIR=str(tmp_path), TEST_PORT=str(port),
        INFERQ_REDIS_ACL_DIR=str(tmp_path / "acl"), INFERQ_REDIS_MAXMEMORY="64mb",
        INFERQ_REDIS_API_PASSWORD="api-pw", INFERQ_REDIS_WORKER_PASSWORD="worker-pw",
        INFERQ_REDIS_BATCH_PASSWORD="batch-pw",
    )  # fmt: skip
    server = subprocess.Popen(["sh", str(REDIS_DIR / "start-redis.sh")], env=env, stdout=subprocess.DEVNULL)
    try:
        api = redis.Redis(port=port, username="api", password="api-pw", retry=Retry(NoBackoff(), 0))
        deadline = time.monotonic() + 10
        while True:
            try:
                assert api.ping()
                break
            except redis.ConnectionError:
                assert server.poll() is None and time.monotonic() < deadline, (tmp_path / "log").read_text()
                time.sleep(0.05)
        argv = (tmp_path / "argv").read_text().split()
        assert argv == ["redis-server", str(REDIS_CONF), "--aclfile", str(tmp_path / "acl" / "users.acl"),
                        "--maxmemory", "64mb"]  # fmt: skip
        assert (tmp_path / "acl" / "users.acl").stat().st_mode & 0o077 == 0, "the ACL file holds passwords"
        # No admin password given: the admin user exists with a random password nobody knows.
        acl_lines = (tmp_path / "acl" / "users.acl").read_text().splitlines()
        (admin_line,) = [line for line in acl_lines if line.startswith("user admin ")]
        assert re.fullmatch(r"user admin on >[0-9a-f]{36} ~\* &\* \+@all", admin_line)
        api.close()

        compose = compose_config(["docker-compose.yml"], {k: v for k, v in os.environ.items() if k != "COMPOSE_FILE"})
        kind, command = compose["services"]["redis"]["healthcheck"]["test"]
        assert kind == "CMD-SHELL" and command.startswith("redis-cli ")
        # NOTE: the same command, pointed at this server's port instead of the container's 6379.
        probe = subprocess.run(["sh", "-c", command.replace("redis-cli ", f"redis-cli -p {port} ", 1)])
        assert probe.returncode == 0
    finally:
        server.terminate()
        server.wait(timeout=10)
    down = subprocess.run(["sh", "-c", command.replace("redis-cli ", f"redis-cli -p {port} ", 1)])
    assert down.returncode != 0, "the healthcheck must fail when Redis is down"


def test_batch_worker_and_api_run_batches_as_restricted_users(
    acl_server: RedisServer, admin: redis.Redis, tiny_llama_dir: Path, tmp_path: Path
) -> None:
    """The Batch API end to end with every service as its own user: upload, a batch run by a Celery worker
    (user batch) through a worker (user worker), a cancelled batch, listing, content, deletion; the sweep
    runs meanwhile. Redis refuses nothing."""
    files = batch_settings(acl_server, PREFIX, tmp_path / "files", redis_url=_url(acl_server, "batch"))
    settings = make_settings(acl_server, PREFIX, tiny_llama_dir, redis_url=_url(acl_server, "worker"))
    api_settings = ApiSettings(redis_url=_url(acl_server, "api"), prefix=PREFIX, api_keys=[API_KEY])
    body = {"model": settings.model_name, "prompt": "hello", "max_tokens": 3, "temperature": 0}
    data = "".join(
        json.dumps({"custom_id": f"c{i}", "method": "POST", "url": "/v1/completions", "body": body}) + "\n"
        for i in range(3)
    ).encode()
    with ThreadWorker(settings):
        api = ThreadApi(api_settings, files.model_copy(update={"redis_url": api_settings.redis_url})).start()
        batch_worker = BatchWorkerProcess(files, tmp_path / "batch.log", "acl")
        try:
            client = openai_client(api)
            upload = client.files.create(file=("in.jsonl", data), purpose="batch")
            batch = client.batches.create(input_file_id=upload.id, endpoint="/v1/completions", completion_window="24h")
            done = wait_batch(client, batch.id, ("completed", "failed"), timeout_s=60)
            assert done.status == "completed", batch_worker.tail()
            assert done.request_counts.completed == 3
            assert len(client.files.content(done.output_file_id).text.splitlines()) == 3
            other = client.batches.create(input_file_id=upload.id, endpoint="/v1/completions", completion_window="24h")
            client.batches.cancel(other.id)
            assert wait_batch(client, other.id, ("cancelled",), timeout_s=60).status == "cancelled"
            assert {b.id for b in client.batches.list().data} == {batch.id, other.id}
            assert upload.id in {f.id for f in client.files.list().data}
            client.files.delete(upload.id)
            time.sleep(2 * files.batch_sweep_interval_s)  # a sweep or two, as the batch user
        finally:
            batch_worker.stop()
            api.stop()
    refusals = [e for e in admin.acl_log(count=100) if e["object"] != "client|setinfo"]
    assert refusals == [], refusals
