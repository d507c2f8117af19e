"""Per-request block tables on top of the block pool, with prefix caching."""
from __future__ import annotations

from typing import Optional

from inferq.gpuworker.engine.block_pool import BlockPool, KVCacheBlock, hash_block
from inferq.gpuworker.engine.request import Request


class KVCacheManager:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True):
        self.block_size = block_size
        self.enable_caching = enable_prefix_caching
        self.pool = BlockPool(num_blocks, enable_prefix_caching)
        self.req_blocks: dict[str, list[KVCacheBlock]] = {}
        # The same tables as plain block ids, appended as blocks are allocated, so the
        # model runner copies only new entries into its persistent block table. A
        # request that is freed and allocated again gets a new list object.
        self.req_block_ids: dict[str, list[int]] = {}
        # How many leading blocks of each request are already in the cache index.
        self._num_cached_blocks: dict[str, int] = {}
        self.prefix_queries = 0  # tokens looked up
        self.prefix_hits = 0  # tokens found

    # -- prefix cache ---------------------------------------------------------
    def _extend_hashes(self, req: Request, upto_tokens: int) -> None:
        """Make sure req.block_hashes covers every full block below upto_tokens."""
        bs = self.block_size
        n_full = upto_tokens // bs
        hashes = req.block_hashes
        while len(hashes) < n_full:
            i = len(hashes)
            parent = hashes[-1] if hashes else None
            hashes.append(hash_block(parent, req.all_token_ids[i * bs : (i + 1) * bs]))

    def get_computed_blocks(self, req: Request) -> tuple[list[KVCacheBlock], int]:
        """Longest cached prefix of a request that has nothing computed yet.

        Never covers the last known token: it must be run through the model to
        produce the logits of the next one.
        """
        if not self.enable_caching:
            return [], 0
        max_hit_blocks = (req.num_tokens - 1) // self.block_size
        if req.pooling is not None and req.pooling.kind == "mean":  # every position's hidden state is needed
            return [], 0
        if req.prompt_logprobs is not None:  # positions whose prompt logprobs are missing must run
            max_hit_blocks = min(max_hit_blocks, (len(req.prompt_logprobs) - 1) // self.block_size)
        self._extend_hashes(req, max_hit_blocks * self.block_size)
        hits: list[KVCacheBlock] = []
        for h in req.block_hashes[:max_hit_blocks]:
            block = self.pool.lookup(h)
            if block is None:
                break
            hits.append(block)
        self.prefix_queries += req.num_tokens
        self.prefix_hits += len(hits) * self.block_size
        return hits, len(hits) * self.block_size

    # -- allocation -----------------------------------------------------------
    def allocate_slots(
        self,
        req: Request,
        num_new_tokens: int,
        computed_blocks: Optional[list[KVCacheBlock]] = None,
    ) -> bool:
        """Give ``req`` room for ``num_new_tokens`` more tokens after its computed
        ones (plus any prefix-hit blocks). Returns False, changing nothing, when
        the pool cannot supply the blocks."""
        if not computed_blocks:  # the common decode case: the last block still has room
            ids = self.req_block_ids.get(req.request_id)
            if ids is not None and req.num_computed_tokens + num_new_tokens <= len(ids) * self.block_size:
                return True
        computed_blocks = computed_blocks or []
        blocks = self.req_blocks.setdefault(req.request_id, [])
        ids = self.req_block_ids.setdefault(req.request_id, [])
        num_computed = req.num_computed_tokens + len(computed_blocks) * self.block_size
        total_tokens = num_computed + num_new_tokens
        needed = -(-total_tokens // self.block_size) - len(blocks) - len(computed_blocks)
        # Hit blocks that are currently free leave the free queue when touched.
        revived = sum(1 for b in computed_blocks if b.ref_cnt == 0)
        if needed > self.pool.num_free_blocks - revived:
            if not blocks:
                del self.req_blocks[req.request_id]
                del self.req_block_ids[req.request_id]
            return False
        if computed_blocks:
            self.pool.touch(computed_blocks)
            blocks.extend(computed_blocks)
            ids.extend(b.block_id for b in computed_blocks)
            self._num_cached_blocks[req.request_id] = len(blocks)
        if needed > 0:
            new = self.pool.allocate(needed)
            blocks.extend(new)
            ids.extend(b.block_id for b in new)
        return True

    def can_allocate_after_freeing(
        self,
        req: Request,
        num_new_tokens: int,
        computed_blocks: Optional[list[KVCacheBlock]],
        others: list[Request],
    ) -> bool:
        """Would ``allocate_slots(req, num_new_tokens, computed_blocks)`` succeed
        once every request in ``others`` had been freed? Changes nothing.

        A block returns to the pool only when every reference to it is dropped,
        so blocks shared with requests outside ``others`` do not count; prefix-hit
        blocks that would be free then must be revived, as allocate_slots does."""
        computed_blocks = computed_blocks or []
        dropped: dict[int, int] = {}
        for other in others:
            for b in self.req_blocks.get(other.request_id, ()):
                dropped[b.block_id] = dropped.get(b.block_id, 0) + 1
        blocks = self.pool.blocks
        freed = sum(1 for bid, n in dropped.items() if blocks[bid].ref_cnt == n)
        own = len(self.req_blocks.get(req.request_id, ()))
        total_tokens = req.num_computed_tokens + len(computed_blocks) * self.block_size + num_new_tokens
        needed = -(-total_tokens // self.block_size) - own - len(computed_blocks)
        revived = sum(1 for b in computed_blocks if b.ref_cnt == dropped.get(b.block_id, 0))
        return needed + revived <= self.pool.num_free_blocks + freed

    def cache_computed_blocks(self, req: Request) -> None:
        """After a forward: register the request's blocks that are now full of
        computed KV. Done after the step, not at allocation, so a request that
        is preempted before its step runs never publishes unwritten blocks."""
        if not self.enable_caching or req.request_id not in self.req_blocks:
            return
        num_tokens = min(req.num_computed_tokens, req.num_tokens)
        n_full = num_tokens // self.block_size
        start = self._num_cached_blocks.get(req.request_id, 0)
        if n_full <= start:
            return
        self._extend_hashes(req, n_full * self.block_size)
        blocks = self.req_blocks[req.request_id]
        for i in range(start, n_full):
            self.pool.cache_block(blocks[i], req.block_hashes[i])
        self._num_cached_blocks[req.request_id] = n_full

    def free_surplus(self, req: Request) -> None:
        """Give back blocks past the request's known tokens: the slots of proposals
        that speculative decoding rejected (they hold no cached prefix: only full
        blocks of computed, known tokens are ever registered)."""
        blocks = self.req_blocks.get(req.request_id)
        if not blocks:
            return
        keep = -(-req.num_tokens // self.block_size)
        if len(blocks) <= keep:
            return
        surplus = blocks[keep:]
        del blocks[keep:]
        # A new list: the runner's persistent table rewrites the row of a new list, where an
        # in-place shrink that grew back to the same length with other blocks would look unchanged.
        self.req_block_ids[req.request_id] = self.req_block_ids[req.request_id][:keep]
        self.pool.free(reversed(surplus))

    def free(self, req: Request) -> None:
        blocks = self.req_blocks.pop(req.request_id, None)
        self.req_block_ids.pop(req.request_id, None)
        self._num_cached_blocks.pop(req.request_id, None)
        if blocks:
            # Tail first: the end of a chain is the least likely to be shared,
            # so it should be the first evicted.
            self.pool.free(reversed(blocks))

    def block_ids(self, request_id: str) -> list[int]:
        return list(self.req_block_ids.get(request_id, ()))

    # -- observability --------------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        return self.pool.num_free_blocks

    def usage(self) -> float:
        return self.pool.usage()

    def check_invariants(self, live_request_ids: Optional[set[str]] = None) -> None:
        refs: dict[int, int] = {}
        for rid, blocks in self.req_blocks.items():
            if live_request_ids is not None:
                assert rid in live_request_ids, f"finished request {rid} still holds blocks"
            assert self.req_block_ids.get(rid) == [b.block_id for b in blocks], f"block id list of {rid} out of step"
            for b in blocks:
                refs[b.block_id] = refs.get(b.block_id, 0) + 1
        self.pool.check_invariants(refs)
