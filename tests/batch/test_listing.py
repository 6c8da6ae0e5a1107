"""GET /v1/files and GET /v1/batches read one owner's index (api/batch_listing.py): pages in creation order
after a cursor, only the caller's records, ids whose records are gone skipped and dropped, and a page's Redis
reads bounded by the page, not by every owner's records. Real Redis; the stores the API and workers use."""

from __future__ import annotations

import secrets

import pytest

from api.batch_listing import list_batches, list_files
from batch.batch_store import BatchStore
from batch.file_store import BATCH, FileStore
from batch.keys import BatchKeys
from tests.redis_server import RedisServer


@pytest.fixture
def stores(redis_server: RedisServer, tmp_path):
    client = redis_server.client(decode_responses=True)
    keys = BatchKeys(f"l{secrets.token_hex(4)}")
    return client, FileStore(client, keys, tmp_path, 3600), BatchStore(client, keys)


def _hgetall_calls(client) -> int:
    return int(client.info("commandstats").get("cmdstat_hgetall", {}).get("calls", 0))


def test_a_page_of_files_is_the_owners_in_order_after_the_cursor(stores):
    client, files, _ = stores
    for i in range(40):
        files.write(f"file-a{i}", "alice", f"a{i}.jsonl", BATCH, b"{}\n")
    mine = [files.write(f"file-b{i}", "bob", f"b{i}.jsonl", BATCH if i != 2 else "batch_output", b"{}\n").id
            for i in range(5)]  # fmt: skip
    before = _hgetall_calls(client)
    first = list_files(files, "bob", None, 2, None, newest_first=True)
    assert _hgetall_calls(client) - before == 2  # bob's two newest: alice's 40 are never read
    assert [r.id for r in first] == mine[::-1][:2]
    rest = list_files(files, "bob", None, 10, first[-1].id, newest_first=True)
    assert [r.id for r in rest] == mine[::-1][2:]
    assert [r.id for r in list_files(files, "bob", None, 10, None, newest_first=False)] == mine
    assert [r.id for r in list_files(files, "bob", BATCH, 10, None, newest_first=False)] == mine[:2] + mine[3:]
    assert list_files(files, "bob", None, 10, "file-a3", newest_first=True) == []  # another owner's cursor
    assert len(list_files(files, "alice", None, 100, None, newest_first=True)) == 40


def test_deleted_and_vanished_files_leave_the_owners_index(stores):
    client, files, _ = stores
    for i in range(3):
        files.write(f"file-{i}", "carol", f"{i}.jsonl", BATCH, b"{}\n")
    files.delete("file-0")
    client.delete(files.keys.file("file-1"))  # the record gone, its id still indexed
    assert [r.id for r in list_files(files, "carol", None, 10, None, newest_first=True)] == ["file-2"]
    assert client.zrange(files.keys.owner_files("carol"), 0, -1) == ["file-2"]


def test_a_page_of_batches_is_the_owners_newest_first(stores):
    client, _, batches = stores
    for i in range(30):
        batches.create(f"batch_a{i}", "alice", "/v1/chat/completions", "file-x", None)
    mine = [batches.create(f"batch_b{i}", "bob", "/v1/completions", "file-y", None)["id"] for i in range(3)]
    before = _hgetall_calls(client)
    page = list_batches(batches, "bob", 2, None)
    assert _hgetall_calls(client) - before == 2
    assert [b["id"] for b in page] == mine[::-1][:2]
    assert [b["id"] for b in list_batches(batches, "bob", 10, page[-1]["id"])] == mine[:1]
    batches.delete(mine[0])
    assert [b["id"] for b in list_batches(batches, "bob", 10, None)] == mine[:0:-1]
    assert client.zrange(batches.keys.owner_batches("bob"), 0, -1) == mine[1:]


def test_records_older_than_the_owner_indexes_are_indexed_once(stores):
    from batch.sweep import index_by_owner

    client, files, batches = stores
    files.write("file-old", "dave", "old.jsonl", BATCH, b"{}\n")
    batches.create("batch_old", "dave", "/v1/completions", "file-old", None)
    client.delete(files.keys.owner_files("dave"), batches.keys.owner_batches("dave"))  # as before the indexes
    assert list_files(files, "dave", None, 10, None, newest_first=True) == []
    assert index_by_owner(client, files.keys) == 2
    assert index_by_owner(client, files.keys) == 0  # already there
    assert [r.id for r in list_files(files, "dave", None, 10, None, newest_first=True)] == ["file-old"]
    assert [b["id"] for b in list_batches(batches, "dave", 10, None)] == ["batch_old"]
