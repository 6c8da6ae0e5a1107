"""The KV block pool's bookkeeping: free list, ref counts, block tables and
hash-based prefix caching with LRU eviction. Pure Python.

A block is `block_size` consecutive token slots of the static KV pool. A full
block gets a hash chained from its parent block's hash and its token ids, so two
requests whose prompts share a prefix of full blocks share those blocks.

NOTE: a block whose ref count drops to 0 keeps its hash and its K/V: it goes to
the tail of the free queue and can still be hit by a later request until it is
popped from the head for reuse. Freeing a request puts its tail blocks in the
queue first, so the least useful blocks (the ends of sequences) are evicted first.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from engine.request import Request


@dataclass
class BlockInfo:
    block_id: int
    ref_count: int = 0
    block_hash: int | None = None


def hash_block(parent_hash: int | None, token_ids: tuple[int, ...]) -> int:
    """Chained hash of a full block: same tokens after the same prefix, same hash."""
    return hash((parent_hash, token_ids))


class BlockManager:
    """Allocates KV blocks to requests.

    Args:
        num_blocks: blocks in the static pool.
        block_size: tokens per block.
        enable_prefix_caching: share full blocks by prefix hash.
    """

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True) -> None:
        if num_blocks < 1:
            raise ValueError(f"the KV pool needs at least one block, got {num_blocks}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.blocks = [BlockInfo(i) for i in range(num_blocks)]
        # Blocks with ref_count 0, least recently freed first (the LRU order of eviction).
        self._free: OrderedDict[int, None] = OrderedDict((i, None) for i in range(num_blocks))
        self._cached: dict[int, int] = {}  # block hash -> block id
        self.block_tables: dict[str, list[int]] = {}
        self._num_hashed: dict[str, int] = {}  # request id -> leading blocks already hashed
        # Prefix-cache counters, in tokens.
        self.num_prefix_queries = 0
        self.num_prefix_hits = 0

    # ---- queries -------------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    @property
    def usage(self) -> float:
        return 1.0 - self.num_free_blocks / self.num_blocks

    @property
    def prefix_cache_hit_rate(self) -> float:
        return self.num_prefix_hits / self.num_prefix_queries if self.num_prefix_queries else 0.0

    def get_block_ids(self, request_id: str) -> list[int]:
        return self.block_tables.get(request_id, [])

    def num_blocks_needed(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    # ---- prefix cache ---------------------------------------------------
    def get_computed_blocks(self, request: Request) -> list[int]:
        """Longest run of cached full blocks that prefix the request's tokens.

        At least one token is always left to compute, so the last prompt token's
        logits exist: a fully cached prompt hits one block less.
        """
        if not self.enable_prefix_caching:
            return []
        tokens = request.all_token_ids
        max_blocks = (len(tokens) - 1) // self.block_size
        hits: list[int] = []
        parent: int | None = None
        for i in range(max_blocks):
            parent = hash_block(parent, tuple(tokens[i * self.block_size : (i + 1) * self.block_size]))
            block_id = self._cached.get(parent)
            if block_id is None:
                break
            hits.append(block_id)
        self.num_prefix_queries += len(tokens)
        self.num_prefix_hits += len(hits) * self.block_size
        return hits

    def cache_full_blocks(self, request: Request, num_computed_tokens: int) -> None:
        """Give hashes to the request's blocks that became full of computed tokens."""
        if not self.enable_prefix_caching:
            return
        table = self.block_tables.get(request.request_id)
        if not table:
            return
        start = self._num_hashed.get(request.request_id, 0)
        end = num_computed_tokens // self.block_size
        if end <= start:
            return
        tokens = request.all_token_ids
        parent = self.blocks[table[start - 1]].block_hash if start else None
        for i in range(start, end):
            block = self.blocks[table[i]]
            parent = hash_block(parent, tuple(tokens[i * self.block_size : (i + 1) * self.block_size]))
            if block.block_hash is None:
                # NOTE: when another block already holds this hash (two requests computed the
                # same prefix concurrently), keep the first; this one stays unshared.
                if parent not in self._cached:
                    block.block_hash = parent
                    self._cached[parent] = block.block_id
            elif block.block_hash != parent:
                raise AssertionError(f"block {block.block_id} hash changed: cached blocks are immutable")
        self._num_hashed[request.request_id] = end

    # ---- allocation -----------------------------------------------------
    def allocate_slots(self, request: Request, num_new_tokens: int, computed_blocks: list[int] | None = None) -> bool:
        """Make room for `num_new_tokens` more tokens after the computed ones.

        Args:
            request: the request; its `num_computed_tokens` must already count the
                tokens of `computed_blocks` when those are given.
            num_new_tokens: tokens to be computed this step.
            computed_blocks: prefix-cache hits from `get_computed_blocks` (first allocation only).

        Returns:
            False, changing nothing, when the free blocks do not suffice.
        """
        # NOTE: new tokens that fit in the blocks the request holds (a decode step's case) need no call here: the
        # scheduler checks that inline for every running request (this path finds it too, at more host time).
        table = self.block_tables.get(request.request_id, [])
        computed_blocks = computed_blocks or []
        num_needed = self.num_blocks_needed(request.num_computed_tokens + num_new_tokens)
        num_new_blocks = num_needed - len(table) - len(computed_blocks)
        # Hits sitting in the free queue are taken out of it, so they do not count as free.
        num_evictable_hits = sum(1 for b in computed_blocks if self.blocks[b].ref_count == 0)
        if num_new_blocks > self.num_free_blocks - num_evictable_hits:
            return False
        if request.request_id not in self.block_tables:
            self.block_tables[request.request_id] = table
        for block_id in computed_blocks:
            self._touch(block_id)
            table.append(block_id)
        if computed_blocks:
            self._num_hashed[request.request_id] = len(table)
        for _ in range(max(num_new_blocks, 0)):
            table.append(self._pop_free())
        return True

    def free(self, request: Request) -> None:
        """Release the request's blocks (tail first, so tails are evicted first)."""
        table = self.block_tables.pop(request.request_id, [])
        self._num_hashed.pop(request.request_id, None)
        for block_id in reversed(table):
            block = self.blocks[block_id]
            block.ref_count -= 1
            if block.ref_count == 0:
                if not self.enable_prefix_caching or block.block_hash is None:
                    block.block_hash = None
                self._free[block_id] = None

    def reset_prefix_cache(self) -> None:
        for block_id in self._free:
            self.blocks[block_id].block_hash = None
        self._cached = {h: b for h, b in self._cached.items() if self.blocks[b].ref_count > 0}

    # ---- internals ------------------------------------------------------
    def _touch(self, block_id: int) -> None:
        block = self.blocks[block_id]
        if block.ref_count == 0:
            del self._free[block_id]
        block.ref_count += 1

    def _pop_free(self) -> int:
        block_id, _ = self._free.popitem(last=False)
        block = self.blocks[block_id]
        if block.block_hash is not None:
            # Evict: the block's old contents are about to be overwritten.
            if self._cached.get(block.block_hash) == block_id:
                del self._cached[block.block_hash]
            block.block_hash = None
        block.ref_count = 1
        return block_id
