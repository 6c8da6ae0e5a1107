"""A burst of requests reaches the request stream in turns (api/submit.py, state.SUBMIT_TURNS): the
first requests are enqueued while later ones have not started their Redis part yet, instead of every
request's SUBSCRIBE running before anyone's enqueue (the script that admits and XADDs it)."""

from __future__ import annotations

import re
import threading
from concurrent.futures import ThreadPoolExecutor

from api.state import SUBMIT_TURNS
from tests.api.wire import MODEL, publish_model

BURST = 3 * SUBMIT_TURNS


def test_a_burst_is_enqueued_in_turns_of_submit_turns(start_api, rclient, redis_server, prefix):
    publish_model(rclient, prefix)
    api = start_api(max_queued_requests=1000)
    events_key, requests_key = f"{prefix}:events:", f"{prefix}:requests"
    order: list[str] = []  # "subscribe" / "enqueue", in the order Redis ran them
    seen: set[tuple[str, str]] = set()  # a script's first EVALSHA may come twice (NOSCRIPT, load, again)
    watching = threading.Event()

    def monitor() -> None:
        client = redis_server.client(decode_responses=True)
        with client.monitor() as m:
            watching.set()
            for command in m.listen():
                text = command["command"]
                if command.get("client_type") == "lua":
                    continue
                request_id = re.search(r"cmpl-[0-9a-f]+", text)
                if request_id is None:
                    continue
                if text.startswith("SUBSCRIBE") and events_key in text:
                    kind = "subscribe"  # the first Redis step of a request without an Idempotency-Key
                elif text.startswith("EVALSHA") and requests_key in text:
                    kind = "enqueue"
                else:
                    continue
                if (kind, request_id.group()) not in seen:
                    seen.add((kind, request_id.group()))
                    order.append(kind)
                if order.count("enqueue") == BURST:
                    return

    watcher = threading.Thread(target=monitor, daemon=True)
    watcher.start()
    assert watching.wait(5)

    def post(i: int) -> int:
        body = {"model": MODEL, "prompt": [1, 2, 3], "max_tokens": 4, "stream": True}
        with api.client(timeout=30) as client, client.stream("POST", "/v1/completions", json=body) as response:
            return response.status_code

    # Redis holds every write for a moment, so that the whole burst is inside the API at once.
    rclient.execute_command("CLIENT", "PAUSE", 400, "WRITE")
    with ThreadPoolExecutor(max_workers=BURST) as pool:
        statuses = list(pool.map(post, range(BURST)))
    watcher.join(10)
    assert statuses == [200] * BURST
    assert order.count("subscribe") == BURST and order.count("enqueue") == BURST, order
    # The k-th request starts its Redis part only once k - SUBMIT_TURNS requests were enqueued.
    started = enqueued = 0
    for kind in order:
        started += kind == "subscribe"
        enqueued += kind == "enqueue"
        assert started <= enqueued + SUBMIT_TURNS, order
    # And the burst did interleave: more than one request was inside its Redis part at once.
    inside = [order[: i + 1].count("subscribe") - order[: i + 1].count("enqueue") for i in range(len(order))]
    assert max(inside) > 1, order
