"""The torch references against naive per-token implementations.

The Triton kernels are tested against ``inferq.kernels.reference``; this file makes
sure the reference itself means what the contract says: token j of a chunk
sits at position seq_len - query_len + j and sees keys at positions <= that,
query head h reads KV head h // (Hq/Hkv), keys come through the block table.
"""
from __future__ import annotations

import math

import pytest
import torch

from inferq.kernels import reference
from tests.kernels.paged_batch import make_paged_batch


def naive_attention(batch, scale: float) -> torch.Tensor:
    """One query token and one head at a time, float64, softmax written out."""
    q = batch.q.double()
    num_heads, head_dim = q.shape[1], q.shape[2]
    num_kv_heads = batch.key_cache.shape[2]
    block_size = batch.key_cache.shape[1]
    out = torch.full_like(q, float("nan"))
    starts = batch.query_start_loc.tolist()
    for i, seq_len in enumerate(batch.seq_lens.tolist()):
        query_len = starts[i + 1] - starts[i]
        table = batch.block_tables[i].tolist()
        for j in range(query_len):
            pos = seq_len - query_len + j
            row = starts[i] + j
            for h in range(num_heads):
                kv_head = h // (num_heads // num_kv_heads)
                weights, values = [], []
                for key_pos in range(pos + 1):
                    block, offset = table[key_pos // block_size], key_pos % block_size
                    k = batch.key_cache[block, offset, kv_head].double()
                    weights.append(float(q[row, h] @ k) * scale)
                    values.append(batch.value_cache[block, offset, kv_head].double())
                top = max(weights)
                exps = [math.exp(w - top) for w in weights]
                total = sum(exps)
                out[row, h] = sum(e / total * v for e, v in zip(exps, values))
    return out


@pytest.mark.parametrize(
    "chunks, num_heads, num_kv_heads, block_size",
    [
        ([(0, 5)], 2, 2, 16),  # prefill from position 0, no GQA
        ([(1, 1), (0, 1)], 3, 1, 16),  # context 1, and a one-token sequence
        ([(16, 1), (5, 14)], 6, 2, 16),  # context a block multiple; chunk starting mid-block
        ([(19, 3), (31, 1)], 8, 2, 32),  # partial last block, block size 32
    ],
)
def test_reference_attention_matches_naive(chunks, num_heads, num_kv_heads, block_size):
    batch = make_paged_batch(
        chunks, num_heads=num_heads, num_kv_heads=num_kv_heads, head_dim=16, block_size=block_size,
        dtype=torch.float32, device="cpu", seed=len(chunks) * 100 + block_size,
    )
    scale = 16**-0.5
    out = reference.unified_attention(*batch.attention_args(batch.poisoned_out(), scale))
    expected = naive_attention(batch, scale)
    assert not out.isnan().any()
    torch.testing.assert_close(out.double(), expected, atol=1e-5, rtol=1e-5)


def test_reference_cache_write_matches_per_token_copy():
    gen = torch.Generator().manual_seed(7)
    key_cache = torch.randn(5, 16, 2, 8, generator=gen)
    value_cache = torch.randn(5, 16, 2, 8, generator=gen)
    key = torch.randn(6, 2, 8, generator=gen)
    value = torch.randn(6, 2, 8, generator=gen)
    slots = torch.tensor([3, 17, -1, 79, 40, 0], dtype=torch.int64)
    expected_k, expected_v = key_cache.clone(), value_cache.clone()
    for t, slot in enumerate(slots.tolist()):
        if slot >= 0:
            expected_k[slot // 16, slot % 16] = key[t]
            expected_v[slot // 16, slot % 16] = value[t]
    reference.reshape_and_cache(key, value, key_cache, value_cache, slots)
    assert torch.equal(key_cache, expected_k)
    assert torch.equal(value_cache, expected_v)


def test_reference_rejects_query_longer_than_sequence():
    batch = make_paged_batch(
        [(0, 4)], num_heads=2, num_kv_heads=1, head_dim=16, block_size=16,
        dtype=torch.float32, device="cpu", seed=0,
    )
    batch.seq_lens[0] = 3
    with pytest.raises(ValueError, match="query tokens but seq_len"):
        reference.unified_attention(*batch.attention_args(batch.poisoned_out(), 0.25))
