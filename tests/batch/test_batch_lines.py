"""What a batch does with its lines: malformed ones go to the error file with OpenAI's codes while the
rest run; a cancel stops new lines and ends with the counts right; uploads that are not batch input are
refused with 400 in OpenAI's envelope."""

from __future__ import annotations

import json
from collections.abc import Callable

import openai
import pytest

from api.settings import ApiSettings
from batch.settings import BatchSettings
from tests.api.processes import SERVED
from tests.api.servers import API_KEY, ThreadApi
from tests.batch.stack import BatchWorkerProcess, openai_client, wait_batch
from tests.redis_server import RedisServer


def _line(custom_id: str, body: dict, url: str = "/v1/chat/completions") -> str:
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": url, "body": body})


def _chat(content: str, **extra) -> dict:
    return {"model": SERVED, "messages": [{"role": "user", "content": content}], "max_tokens": 4, "seed": 7, **extra}


def _upload(client: openai.OpenAI, lines: list[str]) -> str:
    return client.files.create(file=("in.jsonl", ("\n".join(lines) + "\n").encode()), purpose="batch").id


def _content(client: openai.OpenAI, file_id: str | None) -> list[dict]:
    return [] if file_id is None else [json.loads(x) for x in client.files.content(file_id).text.splitlines()]


def test_malformed_lines_go_to_the_error_file_while_the_rest_run(
    api: ThreadApi, start_batch_worker: Callable[..., BatchWorkerProcess]
) -> None:
    start_batch_worker()
    client = openai_client(api)
    too_hot = _chat("hot", temperature=5)
    too_long = _chat("long", max_tokens=100_000)
    lines = [
        _line("ok-1", _chat("one")),
        '{"custom_id": "broken", "method": "POST", "url": ',
        _line("embed", _chat("x"), url="/v1/embeddings"),
        _line("ok-2", _chat("two")),
        _line("ok-1", _chat("again")),
        _line("hot", too_hot),
        _line("long", too_long),
        json.dumps({"method": "POST", "url": "/v1/chat/completions", "body": _chat("no id")}),
        _line("other-model", {**_chat("m"), "model": "no-such-model"}),
        _line("ok-3", _chat("three")),
    ]
    batch = client.batches.create(
        input_file_id=_upload(client, lines), endpoint="/v1/chat/completions", completion_window="24h"
    )
    done = wait_batch(client, batch.id, ("completed", "failed"), timeout_s=60)
    assert done.status == "completed"
    assert (done.request_counts.total, done.request_counts.completed, done.request_counts.failed) == (10, 3, 7)
    assert sorted(x["custom_id"] for x in _content(client, done.output_file_id)) == ["ok-1", "ok-2", "ok-3"]
    errors = _content(client, done.error_file_id)
    assert [x["id"].rsplit("_", 1)[1] for x in errors] == ["2", "3", "5", "6", "7", "8", "9"]  # in input order
    by_line = {int(x["id"].rsplit("_", 1)[1]): x for x in errors}
    assert by_line[2]["error"]["code"] == "invalid_json_line" and by_line[2]["response"] is None
    assert by_line[3]["error"]["code"] == "invalid_url"
    assert by_line[5]["error"]["code"] == "duplicate_custom_id" and by_line[5]["custom_id"] == "ok-1"
    assert by_line[8]["error"]["code"] == "missing_required_parameter"
    # Bodies the API refuses: the status and body it answers to the same request over HTTP.
    with api.client() as http:
        for number, body in ((6, too_hot), (7, too_long), (9, {**_chat("m"), "model": "no-such-model"})):
            answer = http.post("/v1/chat/completions", json=body)
            line = by_line[number]
            assert line["error"] is None
            assert line["response"]["status_code"] == answer.status_code
            assert line["response"]["body"] == answer.json()
    assert by_line[6]["response"]["body"]["error"]["param"] == "temperature"
    assert by_line[7]["response"]["body"]["error"]["code"] == "context_length_exceeded"
    assert by_line[9]["response"]["status_code"] == 404


def test_cancel_stops_new_lines_and_ends_with_the_counts_right(
    api: ThreadApi, redis_server: RedisServer, prefix: str, start_batch_worker: Callable[..., BatchWorkerProcess]
) -> None:
    start_batch_worker()
    client = openai_client(api)
    total = 200
    lines = [_line(f"c-{i}", _chat(f"Tell a story about {i}.", max_tokens=24)) for i in range(total)]
    # Lines sent are counted by the stream's entries ever added (XINFO STREAM), not by reading the entries: the
    # worker trims acknowledged ones every 30 s, and nothing else sends while this test runs.
    stream = redis_server.client(decode_responses=True)
    added_before = stream.xinfo_stream(f"{prefix}:requests")["entries-added"]
    batch = client.batches.create(
        input_file_id=_upload(client, lines), endpoint="/v1/chat/completions", completion_window="24h"
    )
    wait_batch(client, batch.id, (), timeout_s=60, until=lambda b: b.request_counts.completed >= 4)
    cancelling = client.batches.cancel(batch.id)
    assert cancelling.status == "cancelling" and cancelling.cancelling_at is not None
    done = wait_batch(client, batch.id, ("cancelled", "completed", "failed"), timeout_s=60)
    assert done.status == "cancelled" and done.cancelled_at is not None
    counts = done.request_counts
    outputs, errors = _content(client, done.output_file_id), _content(client, done.error_file_id)
    sent = stream.xinfo_stream(f"{prefix}:requests")["entries-added"] - added_before
    stream.close()
    assert counts.total == total
    assert 0 < sent < total  # new lines stopped
    assert counts.completed + counts.failed == sent  # every line sent is answered once
    assert len(outputs) == counts.completed and len(errors) == counts.failed
    assert all(x["error"]["code"] == "batch_cancelled" for x in errors)
    # A cancelled batch stays cancelled; cancelling it again answers it as it is.
    assert client.batches.cancel(batch.id).status == "cancelled"


@pytest.mark.parametrize(
    ("data", "purpose", "param", "code"),
    [
        (b"\x89PNG\r\n\x1a\n\x00\x00", "batch", "file", "invalid_file_format"),
        (b"just some text\nand more\n", "batch", "file", "invalid_file_format"),
        (b"", "batch", "file", "invalid_file_format"),
        (b'{"custom_id": "x"}\n' * 5000, "batch", "file", "file_too_large"),  # over the test's 64 KiB
        (b'{"custom_id": "x"}\n', "fine-tune", "purpose", "invalid_value"),
    ],
    ids=["binary", "not-jsonl", "empty", "too-large", "other-purpose"],
)
def test_an_upload_that_is_not_batch_input_is_refused_with_400(
    api: ThreadApi, data: bytes, purpose: str, param: str, code: str
) -> None:
    with api.client() as http:
        answer = http.post("/v1/files", files={"file": ("in.jsonl", data)}, data={"purpose": purpose})
    assert answer.status_code == 400
    error = answer.json()["error"]
    assert (error["param"], error["code"], error["type"]) == (param, code, "invalid_request_error")
    assert param in error["message"]


def test_batch_creation_names_the_bad_field(api: ThreadApi) -> None:
    client = openai_client(api)
    file_id = _upload(client, [_line("a", _chat("a"))])
    cases = [
        ({"input_file_id": "file-missing", "endpoint": "/v1/chat/completions"}, "input_file_id"),
        ({"input_file_id": file_id, "endpoint": "/v1/embeddings"}, "endpoint"),
        (
            {"input_file_id": file_id, "endpoint": "/v1/chat/completions", "completion_window": "48h"},
            "completion_window",
        ),
        ({"input_file_id": file_id, "endpoint": "/v1/chat/completions", "metadata": {"k": 1}}, "metadata.k"),
    ]
    with api.client() as http:
        for body, param in cases:
            answer = http.post("/v1/batches", json={"completion_window": "24h", **body})
            assert answer.status_code == 400, answer.text
            assert answer.json()["error"]["param"] == param
        assert http.get("/v1/batches/batch_missing").status_code == 404
        assert http.get("/v1/files/file-missing").status_code == 404
    with api.client(api_key=None) as anonymous:
        assert anonymous.get(f"/v1/files/{file_id}").status_code == 401
    with pytest.raises(openai.NotFoundError):
        client.files.retrieve("file-missing")


def test_an_api_key_sees_only_its_own_files_and_batches(
    redis_server: RedisServer, prefix: str, settings: BatchSettings, api: ThreadApi
) -> None:
    other_key = "sk-test-key-2"
    api_settings = ApiSettings(redis_url=redis_server.url, prefix=prefix, api_keys=[API_KEY, other_key])
    shared = ThreadApi(api_settings, settings).start()
    try:
        mine = openai_client(shared)
        theirs = openai.OpenAI(base_url=f"{shared.url}/v1", api_key=other_key, max_retries=0)
        file_id = _upload(mine, [_line("a", _chat("a"))])
        batch = mine.batches.create(input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="24h")
        mine.batches.cancel(batch.id)
        with pytest.raises(openai.NotFoundError):
            theirs.files.retrieve(file_id)
        with pytest.raises(openai.NotFoundError):
            theirs.batches.retrieve(batch.id)
        with pytest.raises(openai.BadRequestError):  # another key's file cannot be run either
            theirs.batches.create(input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="24h")
        assert file_id not in {f.id for f in theirs.files.list().data}
        assert batch.id not in {b.id for b in theirs.batches.list().data}
        assert file_id in {f.id for f in mine.files.list().data}
    finally:
        shared.stop()


def test_a_batch_past_its_window_expires_with_its_lines_in_the_error_file(
    api: ThreadApi, redis_server: RedisServer, prefix: str, start_batch_worker: Callable[..., BatchWorkerProcess]
) -> None:
    client = openai_client(api)
    lines = [_line(f"e-{i}", _chat(f"late {i}")) for i in range(3)]
    batch = client.batches.create(
        input_file_id=_upload(client, lines), endpoint="/v1/chat/completions", completion_window="24h"
    )
    # Its 24 hours are over before any batch worker takes it.
    redis_server.client(decode_responses=True).hset(f"{prefix}:batch:b:{batch.id}", "expires_at", "1")
    start_batch_worker()
    done = wait_batch(client, batch.id, ("expired", "completed", "failed"), timeout_s=60)
    assert done.status == "expired" and done.expired_at is not None
    assert (done.request_counts.total, done.request_counts.completed, done.request_counts.failed) == (3, 0, 3)
    assert done.output_file_id is None
    errors = _content(client, done.error_file_id)
    assert sorted(x["custom_id"] for x in errors) == ["e-0", "e-1", "e-2"]
    assert {x["error"]["code"] for x in errors} == {"batch_expired"}
