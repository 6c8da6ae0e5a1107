"""BlockManager: exact block ids, ref counts, prefix hits and LRU eviction order."""

from engine.block_manager import BlockManager
from engine.request import Request
from engine.sampling_params import SamplingParams

BS = 4


def make(rid: str, tokens: list[int]) -> Request:
    return Request(request_id=rid, prompt_token_ids=tokens, sampling_params=SamplingParams())


def admit(bm: BlockManager, req: Request) -> list[int]:
    """Allocate like the scheduler does for a waiting request, then mark all its tokens computed."""
    hits = bm.get_computed_blocks(req)
    req.num_computed_tokens = len(hits) * BS
    assert bm.allocate_slots(req, req.num_tokens - req.num_computed_tokens, hits)
    req.num_computed_tokens = req.num_tokens
    bm.cache_full_blocks(req, req.num_computed_tokens)
    return hits


def test_allocation_takes_lowest_free_blocks_in_order():
    bm = BlockManager(8, BS)
    a = make("a", list(range(10)))  # 3 blocks
    admit(bm, a)
    assert bm.get_block_ids("a") == [0, 1, 2]
    assert [bm.blocks[i].ref_count for i in range(4)] == [1, 1, 1, 0]
    assert bm.num_free_blocks == 5


def test_allocate_refuses_without_changing_state_when_pool_is_short():
    bm = BlockManager(3, BS)
    a = make("a", list(range(13)))  # needs 4 blocks
    assert not bm.allocate_slots(a, 13)
    assert bm.num_free_blocks == 3
    assert bm.get_block_ids("a") == []


def test_decode_growth_allocates_a_block_only_at_the_boundary():
    bm = BlockManager(8, BS)
    a = make("a", list(range(4)))
    admit(bm, a)
    assert bm.get_block_ids("a") == [0]
    a.append_token(100)  # 5th token needs a 2nd block
    assert bm.allocate_slots(a, 1)
    assert bm.get_block_ids("a") == [0, 1]
    a.num_computed_tokens += 1
    a.append_token(101)
    assert bm.allocate_slots(a, 1)
    assert bm.get_block_ids("a") == [0, 1]


def test_prefix_hit_shares_full_blocks_and_bumps_ref_counts():
    bm = BlockManager(10, BS)
    shared = list(range(8))
    a = make("a", shared + [50, 51])
    admit(bm, a)
    assert bm.get_block_ids("a") == [0, 1, 2]
    b = make("b", shared + [60, 61, 62])
    hits = admit(bm, b)
    assert hits == [0, 1]
    assert bm.get_block_ids("b") == [0, 1, 3]
    assert bm.blocks[0].ref_count == 2 and bm.blocks[1].ref_count == 2
    assert bm.blocks[2].ref_count == 1 and bm.blocks[3].ref_count == 1


def test_fully_cached_prompt_leaves_last_block_to_compute():
    bm = BlockManager(10, BS)
    a = make("a", list(range(8)))
    admit(bm, a)
    bm.free(a)
    b = make("b", list(range(8)))
    assert bm.get_computed_blocks(b) == [0]  # block 1 would leave nothing to compute


def test_freed_blocks_stay_cached_until_evicted_in_lru_order():
    bm = BlockManager(4, BS)
    a = make("a", list(range(8)))  # blocks 0, 1 (both full, hashed)
    admit(bm, a)
    bm.free(a)
    # Free queue order: 2, 3 (never used), then a's tail first: 1, 0.
    assert list(bm._free) == [2, 3, 1, 0]
    assert bm.blocks[0].block_hash is not None and bm.blocks[1].block_hash is not None
    c = make("c", list(range(100, 112)))  # 3 blocks: takes 2, 3, then evicts 1
    admit(bm, c)
    assert bm.get_block_ids("c") == [2, 3, 1]
    assert bm.blocks[1].block_hash != hash((None, (4, 5, 6, 7)))
    # a's first block is still cached: a prompt starting with it hits block 0 only.
    d = make("d", list(range(8)) + [9])
    assert bm.get_computed_blocks(d) == [0]


def test_hit_on_free_block_takes_it_out_of_the_free_queue():
    bm = BlockManager(3, BS)
    a = make("a", list(range(4)) + [9])
    admit(bm, a)
    bm.free(a)
    b = make("b", list(range(4)) + [7, 7, 7, 7, 7])  # hit block 0, needs 2 more blocks
    hits = admit(bm, b)
    assert hits == [0]
    assert bm.get_block_ids("b") == [0, 2, 1]
    assert bm.num_free_blocks == 0


def test_hit_blocks_do_not_count_as_free_capacity():
    bm = BlockManager(2, BS)
    a = make("a", list(range(4)) + [9])
    admit(bm, a)
    bm.free(a)
    b = make("b", list(range(4)) + [1] * 8)  # hit block 0, needs 2 more: only 1 really free
    hits = bm.get_computed_blocks(b)
    b.num_computed_tokens = 4
    assert not bm.allocate_slots(b, b.num_tokens - 4, hits)
    assert bm.blocks[0].ref_count == 0 and bm.num_free_blocks == 2


def test_shared_block_survives_until_last_reference_is_freed():
    bm = BlockManager(6, BS)
    a = make("a", list(range(5)))
    b = make("b", list(range(5)))
    admit(bm, a)
    admit(bm, b)
    assert bm.blocks[0].ref_count == 2
    bm.free(a)
    assert bm.blocks[0].ref_count == 1 and 0 not in bm._free
    bm.free(b)
    assert bm.blocks[0].ref_count == 0 and 0 in bm._free


def test_prefix_caching_off_never_hits_and_drops_hashes():
    bm = BlockManager(6, BS, enable_prefix_caching=False)
    a = make("a", list(range(9)))
    admit(bm, a)
    bm.free(a)
    assert bm.get_computed_blocks(make("b", list(range(9)))) == []
    assert all(b.block_hash is None for b in bm.blocks)


def test_hit_rate_counts_tokens():
    bm = BlockManager(8, BS)
    admit(bm, make("a", list(range(9))))
    admit(bm, make("b", list(range(9))))
    # a: 9 queried, 0 hit; b: 9 queried, 8 hit.
    assert bm.prefix_cache_hit_rate == 8 / 18
