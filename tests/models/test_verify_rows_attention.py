"""A speculative decode's k + 1 rows after a context: the C decode kernel (row j
sees context + j + 1 keys) gives what the torch path's causal chunk gives, and
each row equals a plain one-row decode at that position bit for bit."""
from __future__ import annotations

import pytest
import torch

from inferq.gpuworker.attention.torch_backend import TorchAttentionBackend
from tests.kernels.test_triton_backend import BLOCK_SIZE, HEAD_DIM, NUM_HEADS, NUM_KV_HEADS, metadata


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_verify_rows_match_the_torch_path_and_single_row_decodes(dtype):
    native = TorchAttentionBackend()
    plain = TorchAttentionBackend(native_decode=False)
    gen = torch.Generator().manual_seed(3)
    tables = [[4, 1, 7], [2, 0, 5]]
    ctx = [(0, 29), (0, 12)]
    caches = [b.allocate_kv_cache(1, 8, BLOCK_SIZE, NUM_KV_HEADS, HEAD_DIM, dtype, "cpu")[0] for b in (native, plain)]

    def run(backend, cache, chunks, q, k, v):
        return backend.forward(q, k, v, cache, metadata(chunks, tables, "cpu"), HEAD_DIM**-0.5)

    n = sum(c[1] for c in ctx)
    q, k, v = (torch.randn(n, h, HEAD_DIM, generator=gen).to(dtype) for h in (NUM_HEADS, NUM_KV_HEADS, NUM_KV_HEADS))
    for backend, cache in zip((native, plain), caches):
        run(backend, cache, ctx, q, k, v)
    if not native._native_kernel:
        pytest.skip("the C kernels do not build on this machine (no C compiler)")
    verify = [(29, 5), (12, 3)]
    q, k, v = (torch.randn(8, h, HEAD_DIM, generator=gen).to(dtype) for h in (NUM_HEADS, NUM_KV_HEADS, NUM_KV_HEADS))
    a = run(native, caches[0], verify, q, k, v)
    b = run(plain, caches[1], verify, q, k, v)
    tol = dict(atol=2e-5, rtol=2e-5) if dtype == torch.float32 else dict(atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(a.float(), b.float(), **tol)
    # Row 2 of the first sequence, alone as a decode at position 31 (its k/v are in the cache now).
    single = native.forward(q[2:3], k[2:3], v[2:3], caches[0], metadata([(31, 1)], tables[:1], "cpu"), HEAD_DIM**-0.5)
    assert torch.equal(single[0], a[2])
