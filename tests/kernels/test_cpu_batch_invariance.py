"""Batch invariance of the CPU kernels, bit for bit: a row's result must not depend on the
other rows of the call, on how many there are, on where the row sits, on how a prompt was cut
into chunks, nor on the thread count.

* attention (inferq_kernels/cpu/paged_decode.c): a token's output from the rows kernel
  (``paged_decode_*_rows``, prompt chunks in tiles of tokens) equals the decode kernel's for the
  same token alone, whatever the chunk's start, length, tile size, block size, GQA group, head
  size and thread count, in the build this CPU gets and in the 8-lane (no AVX-512) and scalar
  (no AVX2) builds; and through the backend, every route a prompt chunk can take ("rows", the
  default, chunks with and without a context) gives the same bits;
* matmuls (gpuworker/models/cpu_linear.py): every row of ``x @ W^T`` equals the same row
  computed alone, at every batch size from 1 to past the kernels' row blocks, with and without
  bias, for every packed layout here, and for the fused gate/up + SiLU kernel;
* the row-wise kernels (add + RMSNorm, SiLU-and-mul, rotary): every row equals itself alone.
"""
from __future__ import annotations

import random

import pytest
import torch

from inferq.gpuworker.attention import cpu_kernels
from inferq.gpuworker.attention.base import AttentionMetadata
from inferq.gpuworker.attention.torch_backend import TorchAttentionBackend

DTYPES = (torch.float32, torch.bfloat16)


@pytest.fixture(scope="module")
def kernel():
    k = cpu_kernels.load()
    if k is None:
        assert cpu_kernels.compiler() is None, "a C compiler is on PATH but the CPU kernels did not build"
        pytest.skip("no C compiler on this machine: inferq runs the torch path instead")
    return k


BUILDS = {"native": [], "avx2": ["-mno-avx512f"], "no-simd": ["-mno-avx512f", "-mno-avx2", "-mno-fma"]}


@pytest.fixture(scope="module", params=list(BUILDS))
def build(request, kernel):
    """paged_decode.c as this CPU gets it, and as a CPU without AVX-512 (8 lanes) or without
    AVX2 (the scalar loops) would: each build's own arithmetic, the same for every row route."""
    if not BUILDS[request.param]:
        return kernel
    from pathlib import Path

    from inferq.kernels.cpu import loader

    if request.param == "avx2" and not loader.cpu_has("avx2", "fma"):
        pytest.skip("no AVX2 + FMA on this CPU")
    lib = loader.build("paged_decode", [*cpu_kernels._FLAGS, *BUILDS[request.param]])
    assert lib is not None
    return cpu_kernels.DecodeKernel(lib, Path(lib._name))


@pytest.fixture
def threads():
    before = torch.get_num_threads()
    yield torch.set_num_threads
    torch.set_num_threads(before)


def _cache(seqs_len, hkv, d, dtype, bs, seed):
    """A shuffled paged cache holding every sequence: (k cache, v cache, block tables [S, W])."""
    gen = torch.Generator().manual_seed(seed)
    rng = random.Random(seed)
    need = [-(-n // bs) for n in seqs_len]
    num_blocks = sum(need) + 2
    free = list(range(num_blocks))
    rng.shuffle(free)
    tables = torch.zeros(len(seqs_len), max(need) + 1, dtype=torch.int32)
    for s, n in enumerate(need):
        tables[s, :n] = torch.tensor([free.pop() for _ in range(n)], dtype=torch.int32)
    kc = (torch.randn(num_blocks, bs, hkv, d, generator=gen) * 2).to(dtype)
    vc = torch.randn(num_blocks, bs, hkv, d, generator=gen).to(dtype)
    return kc, vc, tables


def _i64(xs):
    return torch.tensor(xs, dtype=torch.int64)


def _decode(kernel, q, kc, vc, tables, seq_of_row, lens, hq, hkv, d, bs, scale):
    """The decode kernel over rows of q (row i: sequence seq_of_row[i], lens[i] keys)."""
    dt = q.dtype
    out = torch.full(q.shape, float("nan"), dtype=dt)
    scratch = torch.empty(hq * (max(lens) + 256) * torch.get_num_threads(), dtype=torch.float32)
    rows, seqs, ls = _i64(range(q.shape[0])), _i64(seq_of_row), _i64(lens)
    fn = kernel.fns["paged_decode_bf16" if dt == torch.bfloat16 else "paged_decode_f32"]
    kernel.sync()
    rc = fn(q.data_ptr(), q.stride(0), out.data_ptr(), out.stride(0), kc.data_ptr(), vc.data_ptr(),
            tables.data_ptr(), tables.stride(0), rows.data_ptr(), seqs.data_ptr(), ls.data_ptr(), q.shape[0],
            hq, hkv, d, bs, scale, scratch.data_ptr())
    assert rc == 0
    return out


def _rows(kernel, q, kc, vc, tables, chunks, hq, hkv, d, bs, scale, tile):
    """The rows kernel over chunks (sequence, context, q_len), their rows one after another in q."""
    dt = q.dtype
    out = torch.full(q.shape, float("nan"), dtype=dt)
    starts, row = [], 0
    for _, _, n in chunks:
        starts.append(row)
        row += n
    max_len = max(c + n for _, c, n in chunks)
    scratch = torch.empty(tile * (hq // hkv) * (max_len + 256) * torch.get_num_threads(), dtype=torch.float32)
    arrays = [_i64(starts), _i64([s for s, _, _ in chunks]), _i64([n for _, _, n in chunks]),
              _i64([c for _, c, _ in chunks])]
    fn = kernel.rows_fns["paged_decode_bf16_rows" if dt == torch.bfloat16 else "paged_decode_f32_rows"]
    kernel.sync()
    rc = fn(q.data_ptr(), q.stride(0), out.data_ptr(), out.stride(0), kc.data_ptr(), vc.data_ptr(),
            tables.data_ptr(), tables.stride(0), *(a.data_ptr() for a in arrays), len(chunks),
            hq, hkv, d, bs, scale, scratch.data_ptr(), tile)
    assert rc == 0
    return out


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hq,hkv,d,bs", [(9, 3, 64, 16), (8, 2, 128, 16), (4, 4, 64, 16), (6, 2, 80, 16),
                                         (9, 3, 64, 8), (9, 3, 64, 32), (4, 1, 32, 32)])
def test_rows_kernel_equals_decode_rows_bit_for_bit(build, threads, dtype, hq, hkv, d, bs):
    """Two sequences of 150 and 61 tokens: every token's attention, from the decode kernel one
    row at a time (on 1 thread) and from the rows kernel with the prompts cut many ways (chunk
    starts and lengths, tile sizes, 1 and 2 threads), must be the same bits."""
    lens = [150, 61]
    kc, vc, tables = _cache(lens, hkv, d, dtype, bs, seed=hq * d + bs)
    gen = torch.Generator().manual_seed(1)
    qs = [torch.randn(n, hq, d, generator=gen).to(dtype) for n in lens]
    scale = d**-0.5
    kernel = build
    threads(1)
    ref = [_decode(kernel, q, kc, vc, tables, [s] * q.shape[0], list(range(1, q.shape[0] + 1)), hq, hkv, d, bs, scale)
           for s, q in enumerate(qs)]
    assert not any(r.float().isnan().any() for r in ref)
    # cuts: each sequence as chunks [a, b); all chunks of one cut go in one call per round
    cuts = [[(0, 150)], [(0, 16), (16, 32), (32, 33), (33, 150)], [(0, 7), (7, 70), (70, 149), (149, 150)],
            [(0, 1), (1, 2), (2, 100), (100, 150)]]
    cuts_b = [[(0, 61)], [(0, 60), (60, 61)], [(0, 17), (17, 34), (34, 61)], [(0, 5), (5, 61)]]
    for tile, nthreads in ((1, 1), (3, 1), (8, 2), (16, 1), (16, 2), (5, 2)):
        threads(nthreads)
        for cut_a, cut_b in zip(cuts, cuts_b):
            for k in range(max(len(cut_a), len(cut_b))):  # round k: chunk k of each sequence, one call
                chunks, qrows, want = [], [], []
                for s, cut in ((0, cut_a), (1, cut_b)):
                    if k < len(cut):
                        a, b = cut[k]
                        chunks.append((s, a, b - a))
                        qrows.append(qs[s][a:b])
                        want.append(ref[s][a:b])
                got = _rows(kernel, torch.cat(qrows), kc, vc, tables, chunks, hq, hkv, d, bs, scale, tile)
                assert torch.equal(got, torch.cat(want)), (tile, nthreads, chunks)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hq,hkv,d,bs", [(9, 3, 64, 16), (8, 2, 128, 16), (4, 4, 64, 16), (6, 2, 80, 16),
                                         (4, 1, 32, 32)])
def test_decode_rows_are_the_same_bits_however_the_threads_split_them(build, threads, dtype, hq, hkv, d, bs):
    """Decode rows of 1 to 8 sequences at 1 to 4 threads: with fewer sequences than 4 per thread
    the kernel gives each thread a share of the (sequence, query head) pairs, a kv head's query
    heads split between threads where a share ends inside its group; with more, whole sequences.
    Every row must be the bits it gets from one thread doing whole sequences."""
    lens = [150, 61, 33, 1, 97, 16, 17, 200]
    kc, vc, tables = _cache(lens, hkv, d, dtype, bs, seed=7 * hq + d)
    q = torch.randn(len(lens), hq, d, generator=torch.Generator().manual_seed(2)).to(dtype)
    kernel = build
    for nseq in (1, 2, 3, 5, 8):
        threads(1)
        want = _decode(kernel, q[:nseq], kc, vc, tables, list(range(nseq)), lens[:nseq], hq, hkv, d, bs, d**-0.5)
        assert not want.float().isnan().any()
        for nthreads in (2, 3, 4):
            threads(nthreads)
            got = _decode(kernel, q[:nseq], kc, vc, tables, list(range(nseq)), lens[:nseq], hq, hkv, d, bs, d**-0.5)
            assert torch.equal(got, want), (nseq, nthreads)


def _meta(chunks, tables_list, bs):
    """AttentionMetadata for (context, q_len) chunks, their sequences' block tables given."""
    slots, pos, qsl, seq_lens, ctx = [], [], [0], [], []
    for (c, n), table in zip(chunks, tables_list):
        for p in range(c, c + n):
            slots.append(table[p // bs] * bs + p % bs)
            pos.append(p)
        qsl.append(qsl[-1] + n)
        seq_lens.append(c + n)
        ctx.append(c)
    width = max(len(t) for t in tables_list)
    bt = torch.zeros(len(chunks), width, dtype=torch.int32)
    for i, t in enumerate(tables_list):
        bt[i, : len(t)] = torch.tensor(t, dtype=torch.int32)
    q_lens = [n for _, n in chunks]
    return AttentionMetadata(
        slot_mapping=_i64(slots), query_start_loc=torch.tensor(qsl, dtype=torch.int32),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32), context_lens=torch.tensor(ctx, dtype=torch.int32),
        block_tables=bt, max_query_len=max(q_lens), max_seq_len=max(seq_lens), block_size=bs,
        query_lens_cpu=q_lens, seq_lens_cpu=seq_lens, all_slots_valid=True)


@pytest.mark.parametrize("dtype", DTYPES)
def test_backend_gives_a_token_the_same_bits_however_its_prompt_is_scheduled(kernel, threads, dtype):
    """One 200-token prompt through the backend (a fresh cache per schedule): whole, in chunks of
    16 and of 64 beside other sequences' decodes and chunks, token by token as decodes, on 1 and 2
    threads, with the default routes and with the rows route forced: every token's output is the
    same bits."""
    hq, hkv, d, bs = 9, 3, 64, 16
    n = 200
    gen = torch.Generator().manual_seed(4)
    q = torch.randn(n, hq, d, generator=gen).to(dtype)
    k = torch.randn(n, hkv, d, generator=gen).to(dtype)
    v = torch.randn(n, hkv, d, generator=gen).to(dtype)
    other_len = 90  # a second sequence sharing the steps: its own prompt, then decodes
    oq = torch.randn(other_len + 40, hq, d, generator=gen).to(dtype)
    ok = torch.randn(other_len + 40, hkv, d, generator=gen).to(dtype)
    ov = torch.randn(other_len + 40, hkv, d, generator=gen).to(dtype)
    table = list(range(0, 13))
    other_table = list(range(13, 22))

    def schedule(cuts, path, nthreads):
        threads(nthreads)
        backend = TorchAttentionBackend(prefill_path=path)
        (kc, vc), = backend.allocate_kv_cache(1, 24, bs, hkv, d, dtype, torch.device("cpu"))
        out = torch.empty(n, hq, d, dtype=dtype)
        other_done = 0
        for a, b in cuts:
            chunks, tables, parts = [(a, b - a)], [table], [(q[a:b], k[a:b], v[a:b])]
            if other_done < other_len + 40:  # the other sequence: 30-token chunks, then decodes
                m = 30 if other_done < other_len else 1
                chunks.append((other_done, m))
                tables.append(other_table)
                sl = slice(other_done, other_done + m)
                parts.append((oq[sl], ok[sl], ov[sl]))
                other_done += m
            meta = _meta(chunks, tables, bs)
            qq, kk, vv = (torch.cat([p[i] for p in parts]) for i in range(3))
            res = backend.forward(qq, kk, vv, (kc, vc), meta, d**-0.5)
            out[a:b] = res[: b - a]
        return out

    whole = schedule([(0, n)], None, 1)
    variants = {
        "chunks of 16": [(i, min(i + 16, n)) for i in range(0, n, 16)],
        "chunks of 64": [(i, min(i + 64, n)) for i in range(0, n, 64)],
        "odd cuts": [(0, 1), (1, 3), (3, 20), (20, 37), (37, 199), (199, 200)],
        "decodes": [(0, 150)] + [(i, i + 1) for i in range(150, n)],
    }
    for name, cuts in variants.items():
        for path in (None, "rows"):
            for nthreads in (1, 2):
                got = schedule(cuts, path, nthreads)
                assert torch.equal(got, whole), (name, path, nthreads)


# ------------------------------------------------------------------ matmuls
def _linear_lib():
    from inferq.gpuworker.models import cpu_linear

    lib = cpu_linear.load()
    if lib is None:
        pytest.skip("no matmul kernel on this CPU")
    return cpu_linear, lib


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n,k", [(320, 192), (1536, 576), (576, 1536), (64, 2400), (96, 64)])
def test_matmul_rows_do_not_depend_on_the_batch(threads, dtype, n, k):
    cpu_linear, lib = _linear_lib()
    w = torch.randn(n, k, generator=torch.Generator().manual_seed(n + k)) / k**0.5
    if not cpu_linear.can_pack(lib, w.to(dtype)):
        pytest.skip(f"no {dtype} kernel for this shape here")
    packed = cpu_linear.PackedWeight(lib, w.to(dtype))
    bias = (torch.randn(n) * 0.1).to(dtype)
    x = torch.randn(300, k, generator=torch.Generator().manual_seed(1)).to(dtype)
    threads(1)
    alone = torch.cat([packed(x[i : i + 1], bias) for i in range(x.shape[0])])
    alone_nb = torch.cat([packed(x[i : i + 1], None) for i in range(x.shape[0])])
    for nthreads in (1, 2):
        threads(nthreads)
        for m in (2, 5, 14, 15, 29, 64, 65, 100, 300):
            for start in (0, 300 - m):
                rows = x[start : start + m]
                assert torch.equal(packed(rows, bias), alone[start : start + m]), (m, start, nthreads)
                assert torch.equal(packed(rows, None), alone_nb[start : start + m]), (m, start, nthreads)


@pytest.mark.parametrize("dtype", DTYPES)
def test_fused_gate_up_rows_do_not_depend_on_the_batch(threads, dtype):
    cpu_linear, lib = _linear_lib()
    w = (torch.randn(1024, 192, generator=torch.Generator().manual_seed(2)) / 192**0.5).to(dtype)
    if not cpu_linear.can_fuse_gate_up(lib, w):
        pytest.skip(f"no fused {dtype} gate/up kernel here")
    packed = cpu_linear.PackedGateUp(lib, w)
    x = torch.randn(120, 192, generator=torch.Generator().manual_seed(3)).to(dtype)
    threads(1)
    alone = torch.cat([packed.silu_mul(x[i : i + 1]) for i in range(x.shape[0])])
    for nthreads in (1, 2):
        threads(nthreads)
        for m in (3, 14, 16, 33, 120):
            assert torch.equal(packed.silu_mul(x[:m]), alone[:m]), (m, nthreads)
            assert torch.equal(packed.silu_mul(x[-m:]), alone[-m:]), (m, nthreads)


# ------------------------------------------------------------------ row-wise kernels
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("h", [576, 200])
def test_rowwise_kernels_do_not_depend_on_the_batch(kernel, threads, dtype, h):
    from inferq.gpuworker.models.llama import add_rms_norm, rotate_qk, silu_and_mul

    gen = torch.Generator().manual_seed(h)
    res = torch.randn(70, h, generator=gen).to(dtype)
    hid = torch.randn(70, h, generator=gen).to(dtype)
    w = (1 + 0.1 * torch.randn(h, generator=gen)).to(dtype)
    gu = torch.randn(70, 2 * h, generator=gen).to(dtype)
    qkv = torch.randn(70, 5 * 64, generator=gen).to(dtype)
    cos = torch.randn(70, 1, 64, generator=gen).to(dtype)
    sin = torch.randn(70, 1, 64, generator=gen).to(dtype)

    def run(lo, hi):
        r = res[lo:hi].clone()
        normed, r = add_rms_norm(r, hid[lo:hi].clone(), w, 1e-5, kernel)
        act = silu_and_mul(gu[lo:hi].clone(), kernel)
        q, k = qkv[lo:hi].split((3 * 64, 2 * 64), dim=-1)
        qo, ko = rotate_qk(q.view(-1, 3, 64), k.view(-1, 2, 64), cos[lo:hi].contiguous(), sin[lo:hi].contiguous(), kernel)
        return normed, r, act, qo, ko

    threads(1)
    alone = [run(i, i + 1) for i in range(70)]
    for nthreads in (1, 2):
        threads(nthreads)
        for lo, hi in ((0, 70), (3, 40), (13, 14), (1, 70)):
            got = run(lo, hi)
            for j, part in enumerate(got):
                assert torch.equal(part, torch.cat([alone[i][j] for i in range(lo, hi)])), (lo, hi, j, nthreads)


def test_prompt_chunks_take_the_rows_kernel_unless_asked_otherwise(kernel):
    meta = _meta([(0, 40), (20, 1), (16, 30)], [[0, 1, 2], [3, 4], [5, 6, 7]], 16)
    plans = {}
    for name, kw in (("default", {}), ("fast", {"batch_invariant": False}), ("tiled", {"prefill_path": "tiled"})):
        plans[name] = TorchAttentionBackend(**kw)._make_plan(meta, 9, 3, torch.bfloat16, torch.device("cpu"))
    assert plans["default"].tiled.kernel == "rows" and plans["default"].tiled.q_lens.tolist() == [40, 30]
    assert plans["default"].tiled.max_len == 46 and plans["default"].native.q_rows.tolist() == [40]
    want = "tiled" if kernel.prefill_fns else "rows"
    assert plans["fast"].tiled.kernel == want
    if kernel.prefill_fns:
        assert plans["tiled"].tiled.kernel == "tiled"
