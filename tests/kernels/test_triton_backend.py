"""The triton attention backend against the engine's torch backend, step by step.

Both backends get the same q/k/v and metadata for a prefill step, then a
mixed step (a continuing prefill chunk next to decodes); the caches they
write and the outputs they return must agree.
"""
from __future__ import annotations

import random

import pytest
import torch

from inferq.gpuworker.attention.base import AttentionMetadata, get_backend
from inferq.gpuworker.attention.triton_backend import TritonAttentionBackend
from inferq.kernels import reference

BLOCK_SIZE = 16
NUM_HEADS, NUM_KV_HEADS, HEAD_DIM = 6, 2, 64


def metadata(chunks, tables, device) -> AttentionMetadata:
    """chunks: (context_len, query_len) per sequence; tables: block ids per sequence."""
    slots, starts, seq_lens = [], [0], []
    for (ctx, n), table in zip(chunks, tables):
        slots += [table[p // BLOCK_SIZE] * BLOCK_SIZE + p % BLOCK_SIZE for p in range(ctx, ctx + n)]
        starts.append(starts[-1] + n)
        seq_lens.append(ctx + n)
    width = max(len(t) for t in tables)
    block_tables = torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.int32)
    return AttentionMetadata(
        slot_mapping=torch.tensor(slots, dtype=torch.int64, device=device),
        query_start_loc=torch.tensor(starts, dtype=torch.int32, device=device),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=device),
        context_lens=torch.tensor([c for c, _ in chunks], dtype=torch.int32, device=device),
        block_tables=block_tables.to(device),
        max_query_len=max(n for _, n in chunks),
        max_seq_len=max(seq_lens),
        block_size=BLOCK_SIZE,
        query_lens_cpu=[n for _, n in chunks],
        seq_lens_cpu=seq_lens,
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_triton_backend_matches_torch_backend_over_two_steps(device, dtype):
    gen = torch.Generator().manual_seed(0)
    triton_backend = get_backend("triton")
    torch_backend = get_backend("torch")
    assert isinstance(triton_backend, TritonAttentionBackend) and triton_backend.name == "triton"
    caches = {
        name: backend.allocate_kv_cache(1, 24, BLOCK_SIZE, NUM_KV_HEADS, HEAD_DIM, dtype, device)[0]
        for name, backend in (("triton", triton_backend), ("torch", torch_backend))
    }
    free = list(range(24))
    random.Random(1).shuffle(free)
    tables = [[free.pop() for _ in range(3)] for _ in range(3)]
    steps = [
        [(0, 20), (0, 5), (0, 17)],  # three prompts (the first is chunked: 20 of its 30 tokens)
        [(20, 10), (5, 1), (17, 1)],  # its last chunk, starting mid-block, next to two decodes
        [(30, 1), (6, 1), (18, 1)],  # decode only
        [(31, 5), (7, 3), (19, 1)],  # speculative decoding: two sequences verify 4 and 2 proposals next to a decode
    ]
    for chunks in steps:
        meta = metadata(chunks, tables, device)
        num_tokens = meta.num_tokens
        q = torch.randn(num_tokens, NUM_HEADS, HEAD_DIM, generator=gen).to(dtype).to(device)
        k = torch.randn(num_tokens, NUM_KV_HEADS, HEAD_DIM, generator=gen).to(dtype).to(device)
        v = torch.randn(num_tokens, NUM_KV_HEADS, HEAD_DIM, generator=gen).to(dtype).to(device)
        out_triton = triton_backend.forward(q, k, v, caches["triton"], meta, HEAD_DIM**-0.5)
        out_torch = torch_backend.forward(q, k, v, caches["torch"], meta, HEAD_DIM**-0.5)
        assert torch.equal(caches["triton"][0], caches["torch"][0])
        assert torch.equal(caches["triton"][1], caches["torch"][1])
        tol = dict(atol=2e-5, rtol=2e-5) if dtype == torch.float32 else dict(atol=3e-2, rtol=3e-2)
        torch.testing.assert_close(out_triton.float(), out_torch.float(), **tol)


def test_forced_split_k_backend_matches_the_torch_backend(device):
    # One decode over 130 cached tokens: three 64-key tiles spread over 4 segments.
    gen = torch.Generator().manual_seed(4)
    split_backend = TritonAttentionBackend(num_kv_splits=4)
    torch_backend = get_backend("torch")
    table = [5, 2, 7, 0, 3, 9, 1, 8, 6]
    context = torch.randn(2, 130, NUM_KV_HEADS, HEAD_DIM, generator=gen).to(device)
    slots = torch.tensor([table[p // BLOCK_SIZE] * BLOCK_SIZE + p % BLOCK_SIZE for p in range(130)], device=device)
    caches = []
    for backend in (split_backend, torch_backend):
        cache = backend.allocate_kv_cache(1, 10, BLOCK_SIZE, NUM_KV_HEADS, HEAD_DIM, torch.float32, device)[0]
        reference.reshape_and_cache(context[0], context[1], cache[0], cache[1], slots)
        caches.append(cache)
    meta = metadata([(130, 1)], [table], device)
    q = torch.randn(1, NUM_HEADS, HEAD_DIM, generator=gen).to(device)
    k = torch.randn(1, NUM_KV_HEADS, HEAD_DIM, generator=gen).to(device)
    v = torch.randn(1, NUM_KV_HEADS, HEAD_DIM, generator=gen).to(device)
    a = split_backend.forward(q, k, v, caches[0], meta, 0.125)
    b = torch_backend.forward(q, k, v, caches[1], meta, 0.125)
    torch.testing.assert_close(a, b, atol=2e-5, rtol=2e-5)


def test_rejects_a_bad_split_count():
    with pytest.raises(ValueError, match="num_kv_splits"):
        TritonAttentionBackend(num_kv_splits=0)
