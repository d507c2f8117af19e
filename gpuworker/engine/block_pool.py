"""The pool of fixed-size KV blocks shared by every request.

A block is free when no request references it (ref_cnt == 0). Free blocks sit
in an LRU queue; a free block that still holds a cached prefix keeps its hash,
so a later request with the same prefix can take it back. Allocation takes
from the front of the queue (least recently freed first) and only then drops
the block's cached identity — eviction is lazy.
"""
from __future__ import annotations

import hashlib
from array import array
from typing import Iterable, Optional


class KVCacheBlock:
    __slots__ = ("block_id", "ref_cnt", "block_hash", "prev_free", "next_free")

    def __init__(self, block_id: int):
        self.block_id = block_id
        self.ref_cnt = 0
        self.block_hash: Optional[bytes] = None
        # Links of the free queue; None when the block is not in it.
        self.prev_free: Optional[KVCacheBlock] = None
        self.next_free: Optional[KVCacheBlock] = None

    def __repr__(self) -> str:
        return f"KVCacheBlock(id={self.block_id}, ref={self.ref_cnt}, cached={self.block_hash is not None})"


class FreeBlockQueue:
    """Doubly linked list with sentinels: O(1) pop from the front, push to the
    back and removal from the middle (a prefix hit revives a free block)."""

    def __init__(self, blocks: Iterable[KVCacheBlock]):
        self._head = KVCacheBlock(-1)
        self._tail = KVCacheBlock(-1)
        self._head.next_free = self._tail
        self._tail.prev_free = self._head
        self.num_free = 0
        for b in blocks:
            self.append(b)

    def append(self, block: KVCacheBlock) -> None:
        last = self._tail.prev_free
        last.next_free = block
        block.prev_free = last
        block.next_free = self._tail
        self._tail.prev_free = block
        self.num_free += 1

    def remove(self, block: KVCacheBlock) -> None:
        block.prev_free.next_free = block.next_free
        block.next_free.prev_free = block.prev_free
        block.prev_free = block.next_free = None
        self.num_free -= 1

    def popleft(self) -> KVCacheBlock:
        block = self._head.next_free
        if block is self._tail:
            raise RuntimeError("no free KV blocks")
        self.remove(block)
        return block

    def __iter__(self):
        b = self._head.next_free
        while b is not self._tail:
            yield b
            b = b.next_free


def hash_block(parent: Optional[bytes], token_ids: list[int]) -> bytes:
    """Chain hash: a block's identity includes every token before it.

    A cryptographic digest, not Python's hash(): a collision would silently
    hand one tenant another tenant's KV.
    """
    h = hashlib.blake2b(digest_size=16)
    h.update(parent or b"root")
    h.update(array("q", token_ids).tobytes())
    return h.digest()


class BlockPool:
    def __init__(self, num_blocks: int, enable_caching: bool = True):
        if num_blocks < 1:
            raise ValueError("the KV cache needs at least one block")
        self.num_blocks = num_blocks
        self.enable_caching = enable_caching
        self.blocks = [KVCacheBlock(i) for i in range(num_blocks)]
        self.free_queue = FreeBlockQueue(self.blocks)
        self.cached: dict[bytes, KVCacheBlock] = {}

    @property
    def num_free_blocks(self) -> int:
        return self.free_queue.num_free

    def usage(self) -> float:
        return 1.0 - self.num_free_blocks / self.num_blocks

    def lookup(self, block_hash: bytes) -> Optional[KVCacheBlock]:
        return self.cached.get(block_hash)

    def touch(self, blocks: Iterable[KVCacheBlock]) -> None:
        """Take a reference on prefix-hit blocks (reviving free ones)."""
        for b in blocks:
            if b.ref_cnt == 0:
                self.free_queue.remove(b)
            b.ref_cnt += 1

    def allocate(self, n: int) -> list[KVCacheBlock]:
        if n > self.num_free_blocks:
            raise RuntimeError(f"asked for {n} KV blocks, {self.num_free_blocks} free")
        out = []
        for _ in range(n):
            b = self.free_queue.popleft()
            if b.block_hash is not None:  # evict its cached identity now
                if self.cached.get(b.block_hash) is b:
                    del self.cached[b.block_hash]
                b.block_hash = None
            b.ref_cnt = 1
            out.append(b)
        return out

    def free(self, blocks: Iterable[KVCacheBlock]) -> None:
        """Drop one reference each; blocks reaching zero join the LRU tail in
        the order given (callers pass tails first, so they are evicted first)."""
        for b in blocks:
            b.ref_cnt -= 1
            assert b.ref_cnt >= 0, f"double free of {b}"
            if b.ref_cnt == 0:
                self.free_queue.append(b)

    def cache_block(self, block: KVCacheBlock, block_hash: bytes) -> None:
        if not self.enable_caching or block.block_hash is not None:
            return
        if block_hash in self.cached:
            # Same content computed twice (two requests raced on one prefix):
            # keep the first; this copy stays private and is simply reused later.
            return
        block.block_hash = block_hash
        self.cached[block_hash] = block

    def check_invariants(self, live_ref_counts: dict[int, int]) -> None:
        """free + referenced = total, and ref counts match the block tables."""
        free_ids = [b.block_id for b in self.free_queue]
        assert len(free_ids) == self.num_free_blocks, "free count drifted from the queue"
        assert len(set(free_ids)) == len(free_ids), "a block is queued twice"
        referenced = [b for b in self.blocks if b.ref_cnt > 0]
        assert len(free_ids) + len(referenced) == self.num_blocks, (
            f"free {len(free_ids)} + referenced {len(referenced)} != total {self.num_blocks}"
        )
        for b in self.blocks:
            expected = live_ref_counts.get(b.block_id, 0)
            assert b.ref_cnt == expected, f"{b} has ref_cnt {b.ref_cnt}, live tables hold {expected}"
            if b.ref_cnt == 0:
                assert b.prev_free is not None, f"{b} is unreferenced but not free"
        for h, b in self.cached.items():
            assert b.block_hash == h, "cache index points at a block with another hash"
