"""inferq_kernels/cpu/paged_prefill.c (tiled causal prefill attention over the paged cache) against
its plain-torch reference (inferq_kernels/cpu/reference.py ``paged_prefill``): random chunks of
several lengths, with and without a context, GQA groups 1-8, head sizes 64 and 128 (and odd
ones), shuffled block tables; the 8-lane (AVX2) build as well as the native one; the AMX kernel
(paged_prefill_amx.c) where the CPU has AMX."""
from __future__ import annotations

import random

import pytest
import torch

from inferq.gpuworker.attention import cpu_kernels
from inferq.kernels.cpu import loader, reference


@pytest.fixture(scope="module")
def kernel():
    k = cpu_kernels.load()
    if k is None or not k.prefill_fns:
        # With a compiler a failed build is a bug; without one the torch path is the product.
        assert cpu_kernels.compiler() is None, "a C compiler is on PATH but the CPU prefill kernel did not build"
        pytest.skip("no C compiler on this machine: inferq runs the torch path instead")
    return k


def run_kernel(fn, chunks, hq, hkv, d, dtype, bs=16, seed=0, q_pad=0):
    """chunks: (context, q_len) per chunk. Returns (out, [reference per chunk])."""
    gen = torch.Generator().manual_seed(seed)
    rng = random.Random(seed)
    num_blocks = sum(-(-(c + n) // bs) for c, n in chunks) + 3
    free = list(range(num_blocks))
    rng.shuffle(free)
    width = max(-(-(c + n) // bs) for c, n in chunks)
    tables = torch.zeros(len(chunks), width + 1, dtype=torch.int32)  # wider than needed, as in a batch
    for s, (c, n) in enumerate(chunks):
        tables[s, : -(-(c + n) // bs)] = torch.tensor([free.pop() for _ in range(-(-(c + n) // bs))], dtype=torch.int32)
    kc = (torch.randn(num_blocks, bs, hkv, d, generator=gen) * 2).to(dtype)
    vc = torch.randn(num_blocks, bs, hkv, d, generator=gen).to(dtype)
    total = sum(n for _, n in chunks)
    # q as a strided view (rows wider than hq * d), as a split of the fused qkv projection gives
    q = torch.randn(total, hq * d + q_pad, generator=gen).to(dtype)[:, : hq * d].view(total, hq, d)
    out = torch.full((total, hq, d), float("nan"), dtype=dtype)
    starts = [0]
    for _, n in chunks[:-1]:
        starts.append(starts[-1] + n)
    arrays = [torch.tensor(x, dtype=torch.int64) for x in
              (starts, list(range(len(chunks))), [n for _, n in chunks], [c for c, _ in chunks])]
    rc = fn(q.data_ptr(), q.stride(0), out.data_ptr(), out.stride(0), kc.data_ptr(), vc.data_ptr(),
            tables.data_ptr(), tables.stride(0), *(a.data_ptr() for a in arrays), len(chunks),
            hq, hkv, d, bs, d**-0.5)
    assert rc == 0
    refs = [reference.paged_prefill(q[st : st + n], kc, vc, tables[s], c, d**-0.5)
            for s, (st, (c, n)) in enumerate(zip(starts, chunks))]
    return out, torch.cat(refs)


def tolerance(dtype, ref):
    # fp32: the online softmax adds in another order and uses the kernel's exp (~1e-7 relative);
    # bf16: both round the fp32 result once, so they differ by at most about one bf16 ulp
    return 1e-5 if dtype == torch.float32 else 2**-7 * max(1.0, ref.float().abs().max().item())


CHUNKS = [
    [(0, 1)],
    [(0, 37)],
    [(5, 2)],  # a speculative-verification-sized chunk
    [(100, 9), (0, 16), (31, 64)],  # different lengths and contexts in one call
    [(16, 16), (17, 15), (1, 130)],  # block edges
    [(512, 40)],
]
HEADS = [(4, 4), (6, 3), (8, 2), (9, 3), (8, 1)]  # groups 1, 2, 4, 3, 8


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("hq,hkv", HEADS)
@pytest.mark.parametrize("case", range(len(CHUNKS)))
def test_kernel_matches_reference(kernel, dtype, d, hq, hkv, case):
    fn = kernel.prefill_fns["paged_prefill_bf16" if dtype == torch.bfloat16 else "paged_prefill_f32"]
    out, ref = run_kernel(fn, CHUNKS[case], hq, hkv, d, dtype, seed=case * 7 + hq, q_pad=d)
    assert torch.isfinite(out.float()).all()  # every row written (out starts as NaN)
    err = (out.float() - ref.float()).abs().max().item()
    assert err < tolerance(dtype, ref), f"max abs diff {err}"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("d,bs", [(80, 16), (32, 8), (8, 32), (256, 16)])
def test_other_head_and_block_sizes(kernel, dtype, d, bs):
    fn = kernel.prefill_fns["paged_prefill_bf16" if dtype == torch.bfloat16 else "paged_prefill_f32"]
    out, ref = run_kernel(fn, [(40, 21), (0, 50), (3, 3)], 6, 2, d, dtype, bs=bs, seed=d + bs)
    err = (out.float() - ref.float()).abs().max().item()
    assert err < tolerance(dtype, ref), f"max abs diff {err}"


def test_rejects_what_it_cannot_do(kernel):
    fn = kernel.prefill_fns["paged_prefill_f32"]
    z = torch.zeros(1, dtype=torch.int64)
    for hq, hkv, d in ((6, 4, 64), (4, 4, 512)):  # heads not a multiple of kv heads; d > 256
        assert fn(0, 0, 0, 0, 0, 0, 0, 0, z.data_ptr(), z.data_ptr(), z.data_ptr(), z.data_ptr(), 0,
                  hq, hkv, d, 16, 1.0) == -1


@pytest.mark.skipif(not loader.cpu_has("avx2", "fma"), reason="no AVX2 + FMA on this CPU")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_avx2_build_matches_reference(kernel, dtype):
    """The 8-lane build that a CPU without AVX-512 gets (built here with AVX-512 turned off)."""
    lib = loader.build("paged_prefill", [*cpu_kernels._PREFILL_FLAGS, "-mno-avx512f"])
    assert lib is not None
    fn = getattr(lib, "paged_prefill_bf16" if dtype == torch.bfloat16 else "paged_prefill_f32")
    fn.argtypes = kernel.prefill_fns["paged_prefill_f32"].argtypes
    fn.restype = kernel.prefill_fns["paged_prefill_f32"].restype
    for chunks, (hq, hkv), d in (([(0, 37), (100, 9)], (9, 3), 64), ([(31, 20), (0, 2)], (8, 1), 128)):
        out, ref = run_kernel(fn, chunks, hq, hkv, d, dtype, seed=d)
        err = (out.float() - ref.float()).abs().max().item()
        assert err < tolerance(dtype, ref), f"max abs diff {err}"


@pytest.fixture(scope="module")
def amx(kernel):
    if kernel.prefill_amx is None:
        pytest.skip("no AMX on this CPU (or Linux refused its tile state): the tile kernel cannot run here")
    return kernel.prefill_amx


@pytest.mark.parametrize("d", [64, 128, 32, 96])
@pytest.mark.parametrize("hq,hkv", HEADS)
@pytest.mark.parametrize("case", range(len(CHUNKS)))
def test_amx_kernel_matches_reference(amx, d, hq, hkv, case):
    """Q K^T and P V on AMX tiles: every row written, within bf16 rounding of the reference (P is
    rounded to bf16 before P V, as a bf16 SDPA does: 0.54 % of the largest output at worst here,
    0.22 % for the vector kernel), for the same chunks and GQA groups as the vector kernel; head
    sizes 32 and 96 take a half pass of P V (two C tiles)."""
    out, ref = run_kernel(amx, CHUNKS[case], hq, hkv, d, torch.bfloat16, seed=case * 7 + hq, q_pad=d)
    assert torch.isfinite(out.float()).all()  # every row written (out starts as NaN)
    err = (out.float() - ref.float()).abs().max().item()
    assert err < tolerance(torch.bfloat16, ref), f"max abs diff {err}"


def test_amx_kernel_block_sizes_threads_and_refusals(kernel, amx):
    """Block sizes 8 and 32 (keys gathered through the table); 2 threads give the same bits as 1;
    a head size that is not a multiple of 32 is refused (the vector kernel takes it)."""
    chunks = [(40, 21), (0, 50), (3, 3), (200, 70)]
    for bs in (8, 32):
        out, ref = run_kernel(amx, chunks, 6, 2, 64, torch.bfloat16, bs=bs, seed=bs)
        assert (out.float() - ref.float()).abs().max().item() < tolerance(torch.bfloat16, ref)
    one, _ = run_kernel(amx, chunks, 9, 3, 64, torch.bfloat16, seed=5)
    torch.set_num_threads(2)
    try:
        kernel.sync()  # the kernels' thread count follows torch's
        two, _ = run_kernel(amx, chunks, 9, 3, 64, torch.bfloat16, seed=5)
    finally:
        torch.set_num_threads(1)
        kernel.sync()
    assert torch.equal(one, two)
    z = torch.zeros(1, dtype=torch.int64)
    assert amx(0, 0, 0, 0, 0, 0, 0, 0, z.data_ptr(), z.data_ptr(), z.data_ptr(), z.data_ptr(), 0,
               4, 4, 80, 16, 1.0) == -1
