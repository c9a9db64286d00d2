"""Logical KV blocks: allocation, reference counts and prefix caching.

A block id indexes the physical pool on every rank. A block whose ref count
drops to 0 goes to the end of the free queue but keeps its hash, so a later
request with the same prefix can take it back (LRU prefix cache). Fresh blocks
come from the front of the queue; taking one evicts its hash.

Several managers may read one rank's pool at once (Flying Serving's KV adaptor: a merged
group's and the requests its ranks wrote before the merge, each in its own view of the
blocks). Managers that share a rank and a range of block ids `share` them: a block one of
them takes leaves the others' free queues (and their prefix caches) until it is freed."""
from __future__ import annotations

from collections import OrderedDict
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the engine's type; kv does not import the engine
    from parashift.engine.sequence import Sequence


def hash_block(parent_hash: int | None, token_ids: list[int]) -> int:
    """Chained hash: a block's hash depends on every token before it."""
    return hash((parent_hash, tuple(token_ids)))


class BlockManager:

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True,
                 ranks: tuple[int, ...] = (0,), offset: int = 0):
        if num_blocks < 1:
            raise ValueError(f"num_blocks must be >= 1, got {num_blocks}")
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.ref_counts = [0] * num_blocks
        self.block_hash: list[int | None] = [None] * num_blocks  # set only while registered
        self.hash_to_block: dict[int, int] = {}
        # ref_count == 0 blocks; front = freed longest ago = next to be reused.
        self.free_queue: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        self.ranks, self.offset = frozenset(ranks), offset  # its blocks: offset + id on each rank
        self.sharing: list[BlockManager] = []  # the other managers of some of its blocks

    # ---- sharing the pool ------------------------------------------------------
    def overlaps(self, other: BlockManager) -> bool:
        return bool(self.ranks & other.ranks) and (
            self.offset < other.offset + other.num_blocks
            and other.offset < self.offset + self.num_blocks)

    def share(self, managers: list[BlockManager]) -> None:
        """Starts sharing blocks with those of `managers` it overlaps: the blocks they use
        are not free here."""
        for other in managers:
            if other is self or other in self.sharing or not self.overlaps(other):
                continue
            self.sharing.append(other)
            other.sharing.append(self)
            for local, count in enumerate(other.ref_counts):
                if count:
                    self._lose(other.offset + local)

    def unshare(self) -> None:
        """Stops sharing (a manager no request uses any more)."""
        assert not any(self.ref_counts), "a manager leaves the pool with no block in use"
        for other in self.sharing:
            other.sharing.remove(self)
        self.sharing = []

    def _uses(self, block: int) -> bool:
        local = block - self.offset
        return 0 <= local < self.num_blocks and self.ref_counts[local] > 0

    def _lose(self, block: int) -> None:
        """Another manager took `block` (a pool id): it is not free here, nor cached."""
        local = block - self.offset
        if 0 <= local < self.num_blocks and local in self.free_queue:
            del self.free_queue[local]
            self._evict_hash(local)

    def _regain(self, block: int) -> None:
        """Another manager freed `block`: free here once no sharer uses it."""
        local = block - self.offset
        if (0 <= local < self.num_blocks and not self.ref_counts[local]
                and not any(other._uses(block) for other in self.sharing)):
            self.free_queue[local] = None

    def _taken(self, local: int) -> None:
        for other in self.sharing:
            other._lose(self.offset + local)

    def _freed(self, local: int) -> None:
        for other in self.sharing:
            other._regain(self.offset + local)

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_queue)

    @property
    def num_used_blocks(self) -> int:
        """Blocks not free here: in use by its requests or by a sharer's."""
        return self.num_blocks - len(self.free_queue)

    @property
    def usage(self) -> float:
        return self.num_used_blocks / self.num_blocks

    def num_blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def get_computed_blocks(self, seq: Sequence) -> tuple[list[int], int]:
        if not self.enable_prefix_caching:
            return [], 0
        assert seq.num_computed_tokens == 0 and not seq.block_table
        max_hit_blocks = (seq.num_tokens - 1) // self.block_size
        block_ids: list[int] = []
        parent_hash = None
        for i in range(max_hit_blocks):
            tokens = seq.token_ids[i * self.block_size:(i + 1) * self.block_size]
            parent_hash = hash_block(parent_hash, tokens)
            block_id = self.hash_to_block.get(parent_hash)
            if block_id is None:
                break
            block_ids.append(block_id)
        return block_ids, len(block_ids) * self.block_size

    def allocate_slots(self, seq: Sequence, num_new_tokens: int,
                       computed_blocks: list[int] = ()) -> bool:
        """Grow seq.block_table to cover its computed tokens, the prefix hit
        and num_new_tokens. On failure nothing changes."""
        num_tokens = (seq.num_computed_tokens + len(computed_blocks) * self.block_size
                      + num_new_tokens)
        if not computed_blocks and num_tokens <= len(seq.block_table) * self.block_size:
            return True  # most decode steps: the last block has room
        assert not computed_blocks or not seq.block_table
        num_fresh = max(0, self.num_blocks_for(num_tokens)
                        - len(seq.block_table) - len(computed_blocks))
        num_revived = sum(1 for b in computed_blocks if self.ref_counts[b] == 0)
        if num_fresh > len(self.free_queue) - num_revived:
            return False
        for block_id in computed_blocks:
            self._take_cached(block_id)
            seq.block_table.append(block_id)
            seq.block_hashes.append(self.block_hash[block_id])
        for _ in range(num_fresh):
            seq.block_table.append(self._take_fresh())
        return True

    def cache_full_blocks(self, seq: Sequence, num_computed_tokens: int) -> None:
        """Register the hashes of seq's blocks that are now completely computed."""
        if not self.enable_prefix_caching:
            return
        num_full = min(num_computed_tokens // self.block_size, len(seq.block_table))
        if len(seq.block_hashes) >= num_full:
            return  # most decode steps: no block filled up
        for i in range(len(seq.block_hashes), num_full):
            parent_hash = seq.block_hashes[-1] if seq.block_hashes else None
            tokens = seq.token_ids[i * self.block_size:(i + 1) * self.block_size]
            block_hash = hash_block(parent_hash, tokens)
            seq.block_hashes.append(block_hash)
            block_id = seq.block_table[i]
            # Same content computed concurrently by another seq: keep the first.
            if block_hash not in self.hash_to_block:
                self.hash_to_block[block_hash] = block_id
                self.block_hash[block_id] = block_hash

    def free(self, seq: Sequence) -> None:
        # Tail first: a sequence's last blocks are evicted before its first.
        for block_id in reversed(seq.block_table):
            self.ref_counts[block_id] -= 1
            assert self.ref_counts[block_id] >= 0
            if self.ref_counts[block_id] == 0:
                self.free_queue[block_id] = None
                if self.sharing:
                    self._freed(block_id)
        seq.block_table.clear()
        seq.block_hashes.clear()

    def _take_cached(self, block_id: int) -> None:
        assert self.block_hash[block_id] is not None, f"block {block_id} is not cached"
        if self.ref_counts[block_id] == 0:
            del self.free_queue[block_id]
            if self.sharing:
                self._taken(block_id)
        self.ref_counts[block_id] += 1

    def _take_fresh(self) -> int:
        block_id, _ = self.free_queue.popitem(last=False)
        self._evict_hash(block_id)
        self.ref_counts[block_id] = 1
        if self.sharing:
            self._taken(block_id)
        return block_id

    def _evict_hash(self, block_id: int) -> None:
        evicted_hash = self.block_hash[block_id]
        if evicted_hash is not None:
            del self.hash_to_block[evicted_hash]
            self.block_hash[block_id] = None
