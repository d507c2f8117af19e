"""Triton unified attention against the torch reference on seeded random paged batches.

Runs interpreted on CPU (TRITON_INTERPRET=1, see conftest.py) or compiled on
a CUDA GPU. Every output starts as NaN, so a row the kernel forgets to write
fails; the cache holds NaN in every slot no sequence owns, so a read past a
sequence's end or through a wrong block fails too.

Error bounds (tests/kernels/paged_batch.py, ERROR_BOUNDS), as
|kernel - reference| <= atol + rtol * |reference|:
  fp32: 2e-5   fp16: 4e-3   bf16: 3e-2
Measured on the CPU interpreter the worst cases sit at 4%, 16% and 25% of them.
"""
from __future__ import annotations

import pytest
import torch

from inferq.kernels import reference
from inferq.kernels.split_k_decode import choose_num_kv_splits
from inferq.kernels.unified_attention import unified_attention
from tests.kernels.paged_batch import ERROR_BOUNDS as TOLERANCE
from tests.kernels.paged_batch import make_paged_batch

# Per sequence: (context_len, query_len).
SCENARIOS = {
    "prefill_from_zero": [(0, 7)],
    "decode_seq_len_1": [(0, 1)],
    "decode_context_1": [(1, 1)],
    "context_block_multiple": [(16, 1), (32, 16), (0, 32)],
    "partial_last_block": [(20, 1), (37, 5)],
    "chunk_starts_mid_block": [(5, 20), (19, 30)],
    "mixed_prefill_decode": [(0, 9), (40, 1), (13, 1), (7, 12), (70, 1)],
    "many_kv_tiles": [(150, 1), (90, 40)],
}
GQA = [(2, 2), (6, 2), (4, 1), (8, 1)]  # (Hq, Hkv): ratios 1, 3, 4, 8
HEAD_DIMS = [64, 128]
BLOCK_SIZES = [16, 32]
DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def run_both(batch, scale: float, num_kv_splits: int | None = None):
    out = unified_attention(*batch.attention_args(batch.poisoned_out(), scale, num_kv_splits))
    ref = reference.unified_attention(*batch.attention_args(batch.poisoned_out(), scale))
    return out, ref


def assert_matches(out: torch.Tensor, ref: torch.Tensor, batch, dtype: torch.dtype) -> None:
    rows = batch.num_rows
    assert not out[:rows].isnan().any(), "kernel left rows unwritten (NaN) or read a poisoned cache slot"
    torch.testing.assert_close(out[:rows].float(), ref[:rows].float(), **TOLERANCE[dtype])
    assert out[rows:].isnan().all(), "kernel wrote padding rows past query_start_loc[-1]"


def sweep():
    """Each dtype x scenario once, rotating GQA ratio, head size and block size."""
    cases = []
    for d, dtype in enumerate(DTYPES):
        for s, (name, chunks) in enumerate(SCENARIOS.items()):
            hq, hkv = GQA[(s + d) % len(GQA)]
            head_dim = HEAD_DIMS[(s + d) % len(HEAD_DIMS)]
            block_size = BLOCK_SIZES[(s // 2 + d) % len(BLOCK_SIZES)]
            case_id = f"{str(dtype)[6:]}-{name}-gqa{hq // hkv}-d{head_dim}-bs{block_size}"
            cases.append(pytest.param(dtype, chunks, hq, hkv, head_dim, block_size, id=case_id))
    return cases


@pytest.mark.parametrize("dtype, chunks, num_heads, num_kv_heads, head_dim, block_size", sweep())
def test_matches_reference(device, dtype, chunks, num_heads, num_kv_heads, head_dim, block_size):
    batch = make_paged_batch(
        chunks, num_heads=num_heads, num_kv_heads=num_kv_heads, head_dim=head_dim, block_size=block_size,
        dtype=dtype, device=device, seed=hash((tuple(chunks), num_heads, head_dim, block_size)) % 10_000,
        pad_rows=2,
    )
    out, ref = run_both(batch, head_dim**-0.5, num_kv_splits=1)
    assert_matches(out, ref, batch, dtype)


@pytest.mark.parametrize("num_heads, num_kv_heads", GQA)
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
def test_every_gqa_ratio_and_head_size_on_a_mixed_batch(device, num_heads, num_kv_heads, head_dim):
    batch = make_paged_batch(
        [(0, 6), (21, 1), (3, 10), (33, 1)], num_heads=num_heads, num_kv_heads=num_kv_heads,
        head_dim=head_dim, block_size=16, dtype=torch.float32, device=device, seed=num_heads * 1000 + head_dim,
    )
    out, ref = run_both(batch, head_dim**-0.5)
    assert_matches(out, ref, batch, torch.float32)


@pytest.mark.parametrize("block_size", [16, 64, 128])
def test_block_size_larger_and_smaller_than_the_key_tile(device, block_size):
    batch = make_paged_batch(
        [(130, 1), (60, 9)], num_heads=4, num_kv_heads=2, head_dim=32, block_size=block_size,
        dtype=torch.float16, device=device, seed=block_size,
    )
    out, ref = run_both(batch, 32**-0.5)
    assert_matches(out, ref, batch, torch.float16)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("num_kv_splits", [1, 2, 3, 8])
def test_split_k_decode(device, dtype, num_kv_splits):
    # Lengths chosen so some segments are empty (seq_len 2 with 8 splits) and
    # some end mid-tile.
    batch = make_paged_batch(
        [(200, 1), (1, 1), (77, 1)], num_heads=6, num_kv_heads=2, head_dim=64, block_size=16,
        dtype=dtype, device=device, seed=num_kv_splits, pad_rows=1,
    )
    out, ref = run_both(batch, 64**-0.5, num_kv_splits=num_kv_splits)
    assert_matches(out, ref, batch, dtype)


def test_forced_split_k_on_a_mixed_batch(device):
    batch = make_paged_batch(
        [(0, 20), (50, 1), (17, 9)], num_heads=4, num_kv_heads=1, head_dim=64, block_size=16,
        dtype=torch.float32, device=device, seed=11, pad_rows=1,
    )
    out, ref = run_both(batch, 0.125, num_kv_splits=3)
    assert_matches(out, ref, batch, torch.float32)


def test_automatic_split_k_engages_for_one_long_decode_and_matches(device):
    chunks = [(300, 1)]
    assert choose_num_kv_splits(1, 1, 1, 301, 132) > 1
    batch = make_paged_batch(
        chunks, num_heads=3, num_kv_heads=1, head_dim=64, block_size=16,
        dtype=torch.bfloat16, device=device, seed=5,
    )
    out, ref = run_both(batch, 0.125, num_kv_splits=None)
    assert_matches(out, ref, batch, torch.bfloat16)


def test_large_scores_stay_finite(device):
    # Scores of several hundred: the online softmax must subtract its running max.
    batch = make_paged_batch(
        [(40, 1), (10, 20)], num_heads=2, num_kv_heads=1, head_dim=64, block_size=16,
        dtype=torch.float32, device=device, seed=3, magnitude=4.0,
    )
    out, ref = run_both(batch, 1.0)
    assert_matches(out, ref, batch, torch.float32)


def test_query_and_output_may_be_strided_views(device):
    # In a model q is a slice of the fused qkv projection, not a contiguous tensor.
    batch = make_paged_batch(
        [(9, 4), (30, 1)], num_heads=4, num_kv_heads=2, head_dim=32, block_size=16,
        dtype=torch.float32, device=device, seed=8,
    )
    fused = torch.randn(batch.q.shape[0], 8 * 32, device=device)
    fused[:, :128] = batch.q.reshape(-1, 128)
    batch.q = fused[:, :128].view(-1, 4, 32)
    out_store = torch.full((batch.q.shape[0], 4, 64), float("nan"), device=device)
    out = out_store[:, :, :32]
    unified_attention(*batch.attention_args(out, 0.2))
    ref = reference.unified_attention(*batch.attention_args(batch.poisoned_out(), 0.2))
    assert_matches(out, ref, batch, torch.float32)
    assert out_store[:, :, 32:].isnan().all()


def test_empty_batch_is_a_no_op(device):
    cache = torch.zeros(2, 16, 1, 64, device=device)
    q = torch.zeros(0, 2, 64, device=device)
    out = unified_attention(
        q, cache, cache.clone(), torch.empty_like(q), torch.zeros(1, dtype=torch.int32, device=device),
        torch.zeros(0, dtype=torch.int32, device=device), torch.zeros(0, 1, dtype=torch.int32, device=device),
        0, 0, 0.125,
    )
    assert out.shape == (0, 2, 64)


def test_bad_input_gets_a_clear_error(device):
    batch = make_paged_batch(
        [(3, 2)], num_heads=4, num_kv_heads=2, head_dim=16, block_size=16,
        dtype=torch.float32, device=device, seed=0,
    )
    args = batch.attention_args(batch.poisoned_out(), 0.1)
    bad_dim = torch.zeros(batch.q.shape[0], 4, 32, device=device)
    with pytest.raises(ValueError, match="q must be"):
        unified_attention(bad_dim, *args[1:])
    three_heads = torch.zeros(batch.q.shape[0], 3, 16, device=device)
    with pytest.raises(ValueError, match="not a multiple of num kv heads"):
        unified_attention(three_heads, args[1], args[2], three_heads.clone(), *args[4:])
    with pytest.raises(ValueError, match="out shape"):
        unified_attention(batch.q, args[1], args[2], torch.empty(1, 4, 16, device=device), *args[4:])
    with pytest.raises(ValueError, match="num_kv_splits"):
        unified_attention(*batch.attention_args(batch.poisoned_out(), 0.1, num_kv_splits=0))
