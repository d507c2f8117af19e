"""Every C kernel on 2 threads gives bit-identical results to 1 thread (OpenMP splits outputs,
never a sum), on random inputs of several shapes."""
from __future__ import annotations

import pytest
import torch

from inferq.gpuworker.attention import cpu_kernels
from inferq.gpuworker.models import cpu_linear
from inferq.gpuworker.models.llama import add_rms_norm, rotate_qk, silu_and_mul

KERNELS = cpu_kernels.load()
pytestmark = pytest.mark.skipif(KERNELS is None or not KERNELS.openmp,
                                reason="no C compiler with OpenMP here: the kernels run on one thread")
DTYPES = [torch.float32, torch.bfloat16]


def at_threads(n, fn):
    old = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        return fn()
    finally:
        torch.set_num_threads(old)


def same_at_1_and_2(fn):
    one, two = at_threads(1, fn), at_threads(2, fn)
    for a, b in zip(one, two):
        assert torch.equal(a, b)
    return one


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m,n,k", [(1, 64, 64), (7, 96, 64), (15, 160, 96), (33, 96, 128), (100, 192, 64)])
def test_linear(dtype, m, n, k):
    lib = cpu_linear.load()
    w = torch.randn(n, k).to(dtype)
    if lib is None or not cpu_linear.can_pack(lib, w):
        pytest.skip(f"no {dtype} matmul kernel on this CPU")
    packed = cpu_linear.PackedWeight(lib, w)
    packed.max_rows = cpu_linear.ALL_ROWS  # the kernel itself at every m (on Intel fp32 stops at 64 rows for MKL)
    x, bias = torch.randn(m, k).to(dtype), torch.randn(n).to(dtype)
    assert packed.applies(x, bias)
    (y,) = same_at_1_and_2(lambda: (packed(x, bias),))
    assert torch.allclose(y.float(), torch.nn.functional.linear(x, w, bias).float(), rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows,h", [(1, 64), (5, 576), (17, 96)])
def test_add_rms_norm(dtype, rows, h):
    res, hid, w = torch.randn(rows, h).to(dtype), torch.randn(rows, h).to(dtype), torch.randn(h).to(dtype)
    same_at_1_and_2(lambda: add_rms_norm(res.clone(), hid, w, 1e-5, KERNELS))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows,inter", [(1, 64), (9, 1536), (20, 100)])
def test_silu_mul(dtype, rows, inter):
    gu = torch.randn(rows, 2 * inter).to(dtype)
    same_at_1_and_2(lambda: (silu_and_mul(gu, KERNELS),))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows,hq,hk,d", [(1, 9, 3, 64), (13, 4, 2, 128), (6, 2, 1, 32)])
def test_rotary(dtype, rows, hq, hk, d):
    q, k = torch.randn(rows, hq, d).to(dtype), torch.randn(rows, hk, d).to(dtype)
    cos, sin = torch.randn(rows, 1, d).to(dtype), torch.randn(rows, 1, d).to(dtype)
    same_at_1_and_2(lambda: rotate_qk(q, k, cos, sin, KERNELS))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("lens,hq,hkv,d", [([1], 9, 3, 64), ([5, 40, 17], 4, 2, 128), ([300, 3, 64, 1, 90], 8, 8, 64),
                                          ([33, 2], 6, 1, 32),
                                          # 2 threads x 4 or more sequences: whole sequences per thread
                                          ([7, 120, 33, 16, 250, 1, 64, 90, 15], 9, 3, 64)])
def test_paged_decode(dtype, lens, hq, hkv, d):
    bs, nblocks = 16, 64
    kc, vc = torch.randn(nblocks, bs, hkv, d).to(dtype), torch.randn(nblocks, bs, hkv, d).to(dtype)
    width = max(-(-n // bs) for n in lens)
    tables = torch.stack([torch.randperm(nblocks)[:width] for _ in lens]).to(torch.int32)
    q = torch.randn(len(lens), hq, d).to(dtype)
    rows = torch.arange(len(lens), dtype=torch.int64)
    lens_t = torch.tensor(lens, dtype=torch.int64)
    fn = KERNELS.fns["paged_decode_bf16" if dtype == torch.bfloat16 else "paged_decode_f32"]

    def run():
        KERNELS.sync()
        out = torch.zeros_like(q)
        scratch = torch.empty(hq * (max(lens) + 256) * torch.get_num_threads(), dtype=torch.float32)
        rc = fn(q.data_ptr(), q.stride(0), out.data_ptr(), out.stride(0), kc.data_ptr(), vc.data_ptr(),
                tables.data_ptr(), tables.stride(0), rows.data_ptr(), rows.data_ptr(), lens_t.data_ptr(),
                len(lens), hq, hkv, d, bs, 0.125, scratch.data_ptr())
        assert rc == 0
        return (out,)

    (out,) = same_at_1_and_2(run)
    # and it is attention: against plain torch over the same paged cache
    from inferq.kernels.cpu import reference

    for i, n in enumerate(lens):
        want = reference.paged_decode(q[i], kc, vc, tables[i], n, 0.125)
        assert torch.allclose(out[i].float(), want.float(), rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("chunks,hq,hkv,d", [([(0, 37)], 9, 3, 64), ([(100, 9), (0, 16), (31, 64)], 8, 2, 128),
                                             ([(5, 2), (300, 40), (0, 1)], 8, 1, 64), ([(16, 33)], 4, 4, 80)])
def test_paged_prefill(dtype, chunks, hq, hkv, d):
    if not KERNELS.prefill_fns:
        pytest.skip("paged_prefill.c did not build")
    bs, nblocks = 16, 64
    kc, vc = torch.randn(nblocks, bs, hkv, d).to(dtype), torch.randn(nblocks, bs, hkv, d).to(dtype)
    width = max(-(-(c + n) // bs) for c, n in chunks)
    tables = torch.stack([torch.randperm(nblocks)[:width] for _ in chunks]).to(torch.int32)
    total = sum(n for _, n in chunks)
    q = torch.randn(total, hq, d).to(dtype)
    starts = torch.tensor([0] + [n for _, n in chunks][:-1], dtype=torch.int64).cumsum(0)
    seqs = torch.arange(len(chunks), dtype=torch.int64)
    q_lens = torch.tensor([n for _, n in chunks], dtype=torch.int64)
    ctx = torch.tensor([c for c, _ in chunks], dtype=torch.int64)
    fn = KERNELS.prefill_fns["paged_prefill_bf16" if dtype == torch.bfloat16 else "paged_prefill_f32"]

    def run():
        KERNELS.sync()
        out = torch.zeros_like(q)
        rc = fn(q.data_ptr(), q.stride(0), out.data_ptr(), out.stride(0), kc.data_ptr(), vc.data_ptr(),
                tables.data_ptr(), tables.stride(0), starts.data_ptr(), seqs.data_ptr(), q_lens.data_ptr(),
                ctx.data_ptr(), len(chunks), hq, hkv, d, bs, d**-0.5)
        assert rc == 0
        return (out,)

    (out,) = same_at_1_and_2(run)
    from inferq.kernels.cpu import reference

    for s, (c, n) in enumerate(chunks):
        st = int(starts[s])
        want = reference.paged_prefill(q[st : st + n], kc, vc, tables[s], c, d**-0.5)
        assert torch.allclose(out[st : st + n].float(), want.float(), rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("threads", [3, 8])
def test_linear_more_threads_than_panels(threads):
    """A narrow projection on a server with more threads than output panels: the threads also
    split row blocks. Bit-identical to one thread, and each row to that row computed alone."""
    lib = cpu_linear.load()
    if lib is None:
        pytest.skip("no float32 matmul kernel on this CPU")
    g = torch.Generator().manual_seed(5)
    w, bias = torch.randn(64, 200, generator=g), torch.randn(64, generator=g)  # 2-4 panels
    packed = cpu_linear.PackedWeight(lib, w)
    x = torch.randn(min(150, packed.max_rows), 200, generator=g)
    one = at_threads(1, lambda: packed(x, bias))
    many = at_threads(threads, lambda: packed(x, bias))
    assert torch.equal(one, many)
    alone = at_threads(threads, lambda: torch.cat([packed(x[i:i + 1], bias) for i in range(x.shape[0])]))
    assert torch.equal(alone, one)
    assert torch.allclose(one, torch.nn.functional.linear(x, w, bias), rtol=1e-4, atol=1e-4)
