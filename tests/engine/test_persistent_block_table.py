"""The model runner's persistent block table follows the KV manager's tables."""
from __future__ import annotations

from inferq.gpuworker.engine.kv_cache_manager import KVCacheManager
from inferq.gpuworker.engine.model_runner import PersistentBlockTable
from inferq.gpuworker.engine.request import Request
from inferq.schemas import SamplingParams


def _req(rid: str, n: int) -> Request:
    return Request(rid, list(range(100, 100 + n)), SamplingParams())


def test_rows_grow_incrementally_and_are_rewritten_after_a_free():
    kv = KVCacheManager(num_blocks=64, block_size=4, enable_prefix_caching=False)
    table = PersistentBlockTable(num_rows=2, max_blocks=2)
    a, b, c = _req("a", 6), _req("b", 3), _req("c", 9)
    for r in (a, b):
        assert kv.allocate_slots(r, r.num_tokens)
    rows = table.rows_for(["a", "b"], kv)
    for rid, row in zip("ab", rows):
        ids = kv.block_ids(rid)
        assert table.table[row, : len(ids)].tolist() == ids
    # a grows past the table width: the row (and the table) widen, old entries stay.
    a.num_computed_tokens = 6
    assert kv.allocate_slots(a, 10)
    (row_a,) = table.rows_for(["a"], kv)
    assert row_a == rows[0] and table.table[row_a, :4].tolist() == kv.block_ids("a")
    # b is freed (finished or preempted) and c needs a row: b's row is reclaimed.
    kv.free(b)
    assert kv.allocate_slots(c, c.num_tokens)
    (row_c,) = table.rows_for(["c"], kv)
    assert table.table[row_c, :3].tolist() == kv.block_ids("c")
    # a freed and allocated again (recompute after preemption) gets its row rewritten.
    kv.free(a)
    a.num_computed_tokens = 0
    assert kv.allocate_slots(a, 5)
    (row_a2,) = table.rows_for(["a"], kv)
    assert table.table[row_a2, :2].tolist() == kv.block_ids("a")
    assert int(table.filled[row_a2]) == 2
    kv.check_invariants()
