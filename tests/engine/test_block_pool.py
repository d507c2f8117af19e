"""Block pool and KV cache manager: ref counts, LRU eviction, prefix hits."""
import pytest

from inferq.gpuworker.engine.block_pool import BlockPool, hash_block
from inferq.gpuworker.engine.kv_cache_manager import KVCacheManager
from inferq.gpuworker.engine.request import Request
from inferq.schemas import SamplingParams


def req(rid, tokens):
    return Request(rid, tokens, SamplingParams(max_tokens=4))


def test_allocate_and_free_keep_counts():
    pool = BlockPool(8)
    a = pool.allocate(3)
    assert pool.num_free_blocks == 5 and all(b.ref_cnt == 1 for b in a)
    pool.free(a)
    assert pool.num_free_blocks == 8
    with pytest.raises(RuntimeError):
        pool.allocate(9)
    pool.check_invariants({})


def test_free_queue_is_lru_and_supports_middle_removal():
    pool = BlockPool(4)
    blocks = pool.allocate(4)
    pool.free([blocks[2], blocks[0], blocks[3], blocks[1]])
    assert [b.block_id for b in pool.free_queue] == [2, 0, 3, 1]
    pool.touch([blocks[3]])  # a prefix hit revives a free block from the middle
    assert [b.block_id for b in pool.free_queue] == [2, 0, 1]
    assert pool.allocate(1)[0].block_id == 2  # least recently freed goes first
    pool.check_invariants({3: 1, 2: 1})


def test_chain_hash_depends_on_parent():
    assert hash_block(None, [1, 2]) != hash_block(hash_block(None, [0]), [1, 2])
    assert hash_block(None, [1, 2]) == hash_block(None, [1, 2])


def test_prefix_hit_reuses_blocks_and_never_covers_last_token():
    kv = KVCacheManager(num_blocks=16, block_size=4)
    tokens = list(range(100, 112))  # exactly 3 full blocks
    a = req("a", tokens)
    hits, n = kv.get_computed_blocks(a)
    assert (hits, n) == ([], 0)
    assert kv.allocate_slots(a, len(tokens))
    a.num_computed_tokens = len(tokens)
    kv.cache_computed_blocks(a)
    b = req("b", tokens)
    hits, n = kv.get_computed_blocks(b)
    # 12 tokens: the hit may cover at most 11, i.e. 2 full blocks.
    assert n == 8 and [x.block_id for x in hits] == kv.block_ids("a")[:2]
    assert kv.allocate_slots(b, len(tokens) - n, hits)
    assert kv.block_ids("b")[:2] == kv.block_ids("a")[:2]
    assert all(x.ref_cnt == 2 for x in hits)
    kv.check_invariants({"a", "b"})
    kv.free(a)
    kv.free(b)
    kv.check_invariants(set())
    assert kv.num_free_blocks == 16


def test_freed_cached_blocks_survive_until_evicted():
    kv = KVCacheManager(num_blocks=4, block_size=4)
    a = req("a", list(range(9)))
    assert kv.allocate_slots(a, 9)
    a.num_computed_tokens = 9
    kv.cache_computed_blocks(a)
    kv.free(a)
    # Still findable after free.
    hits, n = kv.get_computed_blocks(req("b", list(range(9))))
    assert n == 8
    # Filling the pool with other content evicts them.
    c = req("c", [7] * 16)
    assert kv.allocate_slots(c, 16)
    hits, n = kv.get_computed_blocks(req("d", list(range(9))))
    assert n == 0
    kv.free(c)
    kv.check_invariants(set())


def test_allocation_fails_atomically_when_pool_is_short():
    kv = KVCacheManager(num_blocks=3, block_size=4)
    a = req("a", list(range(8)))
    assert kv.allocate_slots(a, 8)
    b = req("b", list(range(50, 58)))
    assert not kv.allocate_slots(b, 8)
    assert kv.block_ids("b") == [] and kv.num_free_blocks == 1
    kv.check_invariants({"a"})


def test_prefix_caching_off_gives_no_hits():
    kv = KVCacheManager(num_blocks=8, block_size=4, enable_prefix_caching=False)
    a = req("a", list(range(9)))
    assert kv.allocate_slots(a, 9)
    a.num_computed_tokens = 9
    kv.cache_computed_blocks(a)
    assert kv.get_computed_blocks(req("b", list(range(9)))) == ([], 0)


def test_blocks_are_published_only_once_computed():
    kv = KVCacheManager(num_blocks=8, block_size=4)
    a = req("a", list(range(9)))
    assert kv.allocate_slots(a, 9)
    # Allocated but not yet run through the model: nothing to share.
    assert kv.get_computed_blocks(req("b", list(range(9)))) == ([], 0)
    a.num_computed_tokens = 9
    kv.cache_computed_blocks(a)
    assert kv.get_computed_blocks(req("c", list(range(9))))[1] == 8
