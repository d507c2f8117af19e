"""The torch paged-attention backend against a deliberately naive reference:
one query token at a time, keys walked position by position, softmax by hand.
The reference never reads the paged cache; it keeps each sequence's full K/V."""
from __future__ import annotations

import math
import random

import pytest
import torch

from inferq.gpuworker.attention.torch_backend import TorchAttentionBackend
from tests.models.paged import build_metadata


def naive_attention(q, keys, values, context, scale):
    """q [Q, Hq, D] for positions context..context+Q-1; keys/values [L, Hkv, D]."""
    n_q, n_heads, _ = q.shape
    groups = n_heads // keys.shape[1]
    out = torch.zeros_like(q, dtype=torch.float64)
    for i in range(n_q):
        last = context + i  # causal: keys 0..last
        for h in range(n_heads):
            kv_h = h // groups
            scores = [float(q[i, h].double() @ keys[j, kv_h].double()) * scale for j in range(last + 1)]
            top = max(scores)
            weights = [math.exp(s - top) for s in scores]
            total = sum(weights)
            for j, w in enumerate(weights):
                out[i, h] += (w / total) * values[j, kv_h].double()
    return out


# The backend has two prefill paths (explicit scores / SDPA) and groups decodes by
# length; these settings force each variant so every path meets the reference.
# "default" takes the C decode kernel where it builds (CPU, one torch thread);
# "torch_decodes" keeps the gather + SDPA decode path.
VARIANTS = {
    "default": {},
    "sdpa_prefill": {"max_explicit_scores": 0},
    "grouped_decodes": {"min_group_saving_blocks": 1, "native_decode": False},
    "torch_decodes": {"native_decode": False},
    "torch_prefills": {"native_prefill": False},
    "tiled_prefills": {"prefill_path": "tiled"},  # inferq_kernels/cpu/paged_prefill.c for every chunk
    "row_prefills": {"prefill_path": "rows"},  # the decode kernel row by row, contexts too
}


def run_case(seqs, n_kv, groups, head_dim=8, block_size=16, seed=0, variant="default"):
    """seqs: list of (context_len, query_len). Returns (ours, reference, caches, slots)."""
    gen = torch.Generator().manual_seed(seed)
    rng = random.Random(seed)
    n_heads = n_kv * groups
    num_blocks = sum(-(-(c + q) // block_size) for c, q in seqs) + 4
    free = list(range(num_blocks))
    rng.shuffle(free)
    backend = TorchAttentionBackend(**VARIANTS[variant])
    (kc, vc), = backend.allocate_kv_cache(1, num_blocks, block_size, n_kv, head_dim, torch.float32, torch.device("cpu"))
    kc.normal_(generator=gen)  # garbage in unused slots must never leak into results
    vc.normal_(generator=gen)

    tables, full_k, full_v, qs = [], [], [], []
    for ctx, q_len in seqs:
        total = ctx + q_len
        table = [free.pop() for _ in range(-(-total // block_size))]
        tables.append(table)
        k = torch.randn(total, n_kv, head_dim, generator=gen)
        v = torch.randn(total, n_kv, head_dim, generator=gen)
        for pos in range(ctx):  # earlier context is already in the cache
            slot = table[pos // block_size] * block_size + pos % block_size
            kc.view(-1, n_kv, head_dim)[slot] = k[pos]
            vc.view(-1, n_kv, head_dim)[slot] = v[pos]
        full_k.append(k)
        full_v.append(v)
        qs.append(torch.randn(q_len, n_heads, head_dim, generator=gen))

    meta, _ = build_metadata(seqs, tables, block_size)
    q = torch.cat(qs)
    k_new = torch.cat([k[c:] for k, (c, _) in zip(full_k, seqs)])
    v_new = torch.cat([v[c:] for v, (c, _) in zip(full_v, seqs)])
    scale = head_dim**-0.5
    out = backend.forward(q, k_new, v_new, (kc, vc), meta, scale)

    ref = torch.cat([naive_attention(qq, k, v, c, scale) for qq, k, v, (c, _) in zip(qs, full_k, full_v, seqs)])
    # every new token's k/v must now sit at its slot
    slots = meta.slot_mapping
    assert torch.equal(kc.view(-1, n_kv, head_dim)[slots], k_new)
    assert torch.equal(vc.view(-1, n_kv, head_dim)[slots], v_new)
    return out, ref


CASES = [
    # (context, query) per sequence: decodes, fresh prefills, chunks with context
    [(0, 1)],  # one-token prompt
    [(0, 7)],  # fresh prefill, partial block
    [(0, 16)],  # exactly one block
    [(1, 1), (15, 1), (16, 1), (17, 1), (47, 1)],  # decodes around block edges
    [(1, 5)],  # context of one token
    [(16, 16)],  # context and chunk both exact block multiples
    [(21, 13)],  # chunk starts mid-block and ends mid-block
    [(5, 1), (0, 9), (40, 1), (20, 30), (3, 1), (0, 33)],  # mixed, decode rows not contiguous
    [(100, 1), (2, 1), (70, 1), (0, 4), (9, 1), (130, 1), (33, 1)],  # decodes of very different lengths
]


@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("groups", [1, 3, 4])
@pytest.mark.parametrize("case", range(len(CASES)))
def test_backend_matches_naive_reference(case, groups, variant):
    out, ref = run_case(CASES[case], n_kv=2, groups=groups, seed=case * 10 + groups, variant=variant)
    assert out.shape == ref.shape
    err = (out.double() - ref).abs().max().item()
    assert err < 1e-5, f"max abs diff {err}"


def test_random_batches_with_other_block_size():
    rng = random.Random(123)
    for trial in range(6):
        seqs = []
        for _ in range(rng.randint(1, 5)):
            ctx = rng.choice([0, 0, 1, 8, 13, rng.randint(0, 40)])
            q_len = rng.choice([1, 1, 2, 8, rng.randint(1, 20)])
            seqs.append((ctx, q_len))
        out, ref = run_case(seqs, n_kv=rng.choice([1, 2]), groups=rng.choice([1, 3, 4]), block_size=8, seed=trial,
                            variant=list(VARIANTS)[trial % len(VARIANTS)])
        err = (out.double() - ref).abs().max().item()
        assert err < 1e-5, f"{seqs}: max abs diff {err}"


def test_negative_slots_are_not_written():
    backend = TorchAttentionBackend()
    (kc, vc), = backend.allocate_kv_cache(1, 4, 16, 1, 8, torch.float32, torch.device("cpu"))
    meta, _ = build_metadata([(0, 3), (0, 2)], [[1], [2]], 16)
    meta.slot_mapping[3:] = -1  # the second sequence is padding
    q = torch.randn(5, 2, 8)
    k = torch.randn(5, 1, 8)
    v = torch.randn(5, 1, 8)
    out = backend.forward(q, k, v, (kc, vc), meta, 8**-0.5)
    assert torch.equal(kc[1, :3, 0], k[:3, 0])
    assert torch.count_nonzero(kc[2]) == 0 and torch.count_nonzero(vc[2]) == 0
    assert torch.count_nonzero(kc[0]) == 0 and torch.count_nonzero(kc[3]) == 0
    ref = naive_attention(q[:3], k[:3], v[:3], 0, 8**-0.5)
    assert (out[:3].double() - ref).abs().max().item() < 1e-5


def test_decodes_are_grouped_by_length():
    backend = TorchAttentionBackend(native_decode=False)
    seqs = [(500, 1), (20, 1), (490, 1), (30, 1), (25, 1)]
    tables = [list(range(i * 40, i * 40 + -(-(c + 1) // 16))) for i, (c, _) in enumerate(seqs)]
    meta, _ = build_metadata(seqs, tables, 16)
    plan = backend._make_plan(meta, 4, 2, torch.float32, torch.device("cpu"))
    assert [g.num_blocks for g in plan.decodes] == [32, 2]  # short ones do not pad to 500 tokens
    assert plan.decodes[0].rows.tolist() == [0, 2] and plan.decodes[1].rows.tolist() == [1, 3, 4]


def test_plan_is_reused_across_layers_of_one_step():
    backend = TorchAttentionBackend()
    (kc, vc), = backend.allocate_kv_cache(1, 4, 16, 2, 8, torch.float32, torch.device("cpu"))
    meta, _ = build_metadata([(0, 4), (0, 1)], [[0], [1]], 16)
    args = (torch.randn(5, 4, 8), torch.randn(5, 2, 8), torch.randn(5, 2, 8), (kc, vc), meta, 0.3)
    first = backend.forward(*args)
    plan = backend._plan
    second = backend.forward(*args)
    assert backend._plan is plan
    assert torch.equal(first, second)
    meta2, _ = build_metadata([(0, 4), (0, 1)], [[0], [1]], 16)
    backend.forward(*args[:4], meta2, 0.3)
    assert backend._plan is not plan


# ---------------------------------------------------------------- the C decode kernel
@pytest.fixture
def one_thread():
    """One torch thread (the kernel also runs on more: tests/models/test_cpu_threads.py)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _native_or_skip():
    from inferq.gpuworker.attention import cpu_kernels

    if cpu_kernels.load() is None:
        # With a compiler a failed build is a bug; without one the torch path is the product.
        assert cpu_kernels.compiler() is None, "a C compiler is on PATH but the CPU kernels did not build"
        pytest.skip("no C compiler on this machine: inferq runs the torch path instead, which the other tests cover")


@pytest.mark.parametrize("groups", [1, 3, 4])
@pytest.mark.parametrize("case", range(len(CASES)))
def test_native_decode_matches_naive_reference(case, groups, one_thread):
    _native_or_skip()
    out, ref = run_case(CASES[case], n_kv=2, groups=groups, seed=case * 10 + groups, variant="default")
    err = (out.double() - ref).abs().max().item()
    assert err < 1e-5, f"max abs diff {err}"


def test_native_decode_is_used_and_skips_the_gather(one_thread):
    _native_or_skip()
    seqs = [(500, 1), (20, 1), (0, 5), (490, 1)]
    tables = [list(range(i * 40, i * 40 + -(-(c + q) // 16))) for i, (c, q) in enumerate(seqs)]
    meta, _ = build_metadata(seqs, tables, 16)
    # the rows route: the prompt that starts at position 0 joins the call, each row with its own key count
    plan = TorchAttentionBackend(prefill_path="rows")._make_plan(meta, 4, 2, torch.float32, torch.device("cpu"))
    assert plan.native is not None and plan.decodes == [] and plan.tiled is None
    assert plan.native.q_rows.tolist() == [0, 1, 2, 3, 4, 5, 6, 7]
    assert plan.native.seq_idx.tolist() == [0, 1, 2, 2, 2, 2, 2, 3]
    assert plan.native.lens.tolist() == [501, 21, 1, 2, 3, 4, 5, 491] and plan.prefills == []
    assert plan.native.max_len == 501
    # by default (the tiled kernel built) decodes take the rows, every prompt chunk the tiled kernel,
    # with or without a context
    backend = TorchAttentionBackend()
    plan = backend._make_plan(meta, 4, 2, torch.float32, torch.device("cpu"))
    if not backend._native_kernel.prefill_fns:
        pytest.skip("paged_prefill.c did not build")
    assert plan.native.q_rows.tolist() == [0, 1, 7] and plan.native.lens.tolist() == [501, 21, 491]
    assert plan.tiled.q_start.tolist() == [2] and plan.tiled.q_lens.tolist() == [5] and plan.prefills == []
    # ... but up to 17 tokens after a context (a speculative verification, or a short chunk) take the
    # decode kernel's rows, so a verified token's logits equal a plain decode's bit for bit
    meta, _ = build_metadata([(20, 1), (32, 24), (7, 20), (40, 3), (16, 17)],
                             [[0, 1], [2, 3, 4, 5], [9, 10], [6, 7, 8], [11, 12, 13]], 16)
    plan = backend._make_plan(meta, 4, 2, torch.float32, torch.device("cpu"))
    assert plan.native.q_rows.tolist() == [0] + list(range(45, 65))
    assert plan.native.lens.tolist() == [21, 41, 42, 43] + list(range(17, 34))
    assert plan.tiled.q_start.tolist() == [1, 25] and plan.tiled.seq_idx.tolist() == [1, 2]
    assert plan.tiled.ctx_lens.tolist() == [32, 7] and plan.tiled.q_lens.tolist() == [24, 20]
    assert plan.prefills == []


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_native_decode_equals_torch_path(dtype, one_thread):
    """Long contexts, odd head sizes, shuffled blocks: the kernel against gather + SDPA
    (float32: within rounding of a different summation order; bfloat16: both round
    fp32 results once, so they differ by at most a bf16 ulp or so)."""
    _native_or_skip()
    gen = torch.Generator().manual_seed(7)
    rng = random.Random(7)
    n_kv, groups, head_dim, bs = 3, 3, 64, 16
    lens = [1, 15, 16, 17, 300, 333, 1000, 64]
    num_blocks = sum(-(-n // bs) for n in lens) + 8
    free = list(range(num_blocks))
    rng.shuffle(free)
    tables = [[free.pop() for _ in range(-(-n // bs))] for n in lens]
    outs = []
    for native in (True, False):
        backend = TorchAttentionBackend(native_decode=native)
        (kc, vc), = backend.allocate_kv_cache(1, num_blocks, bs, n_kv, head_dim, dtype, torch.device("cpu"))
        g = torch.Generator().manual_seed(1)
        kc.copy_(torch.randn(kc.shape, generator=g) * 2)
        vc.copy_(torch.randn(vc.shape, generator=g))
        meta, _ = build_metadata([(n - 1, 1) for n in lens], tables, bs)
        q = torch.randn(len(lens), n_kv * groups, head_dim, generator=gen).to(dtype)
        k = torch.randn(len(lens), n_kv, head_dim, generator=gen).to(dtype)
        v = torch.randn(len(lens), n_kv, head_dim, generator=gen).to(dtype)
        gen = torch.Generator().manual_seed(7)  # same q/k/v for both runs
        outs.append(backend.forward(q, k, v, (kc, vc), meta, head_dim**-0.5))
        assert (backend._plan.native is not None) == native
    err = (outs[0].float() - outs[1].float()).abs().max().item()
    assert err < (1e-5 if dtype == torch.float32 else 2e-2), f"max abs diff {err}"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_native_prefill_equals_torch_path(dtype, one_thread):
    """Prompts starting at position 0 (one past the explicit-scores limit, so SDPA's path
    is compared too) beside decodes: the kernel's rows against baddbmm/SDPA."""
    _native_or_skip()
    n_kv, groups, head_dim, bs = 3, 3, 64, 16
    seqs = [(0, 300), (40, 1), (0, 17), (0, 1), (129, 1)]
    tables, nxt = [], 0
    for c, q in seqs:
        n = -(-(c + q) // bs)
        tables.append(list(range(nxt, nxt + n)))
        nxt += n
    meta, _ = build_metadata(seqs, tables, bs)
    t = sum(q for _, q in seqs)
    g = torch.Generator().manual_seed(3)
    q = torch.randn(t, n_kv * groups, head_dim, generator=g).to(dtype)
    k = (torch.randn(t, n_kv, head_dim, generator=g) * 2).to(dtype)
    v = torch.randn(t, n_kv, head_dim, generator=g).to(dtype)
    cache = torch.randn(2, nxt + 2, bs, n_kv, head_dim, generator=g).to(dtype)
    outs = []
    for native, limit in ((True, 0), (False, 0), (False, 1 << 30)):
        backend = TorchAttentionBackend(native_prefill=native, max_explicit_scores=limit)
        kc, vc = cache[0].clone(), cache[1].clone()
        outs.append(backend.forward(q, k, v, (kc, vc), meta, head_dim**-0.5).float())
        assert (backend._plan.prefills == []) == native
    # bf16: the torch paths round the probabilities to bf16 before p.v (2^-8 relative
    # per term), the kernel keeps them in fp32; both round the output once.
    tol = 1e-5 if dtype == torch.float32 else 2**-6 * max(1.0, outs[0].abs().max().item())
    for other in outs[1:]:
        err = (outs[0] - other).abs().max().item()
        assert err < tol, f"max abs diff {err}"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_tiled_prefill_equals_torch_path(dtype, one_thread):
    """Chunks with a context (a later chunk, a prefix-cache hit; one past the explicit-scores
    limit, so SDPA's path is compared too), a fresh prompt and decodes in one step: the tiled
    kernel (inferq_kernels/cpu/paged_prefill.c) against baddbmm/SDPA and the decode kernel's rows."""
    _native_or_skip()
    n_kv, groups, head_dim, bs = 3, 3, 64, 16
    seqs = [(200, 300), (40, 1), (0, 17), (16, 5), (129, 1), (777, 64)]
    tables, nxt = [], 0
    for c, q in seqs:
        n = -(-(c + q) // bs)
        tables.append(list(range(nxt + n - 1, nxt - 1, -1)))  # blocks in reverse: not contiguous
        nxt += n
    meta, _ = build_metadata(seqs, tables, bs)
    t = sum(q for _, q in seqs)
    g = torch.Generator().manual_seed(5)
    q = torch.randn(t, n_kv * groups, head_dim, generator=g).to(dtype)
    k = (torch.randn(t, n_kv, head_dim, generator=g) * 2).to(dtype)
    v = torch.randn(t, n_kv, head_dim, generator=g).to(dtype)
    cache = (torch.randn(2, nxt + 2, bs, n_kv, head_dim, generator=g) * 2).to(dtype)
    outs = []
    for path, limit in (("tiled", 0), ("torch", 0), ("torch", 1 << 30), ("rows", 0)):
        backend = TorchAttentionBackend(prefill_path=path, max_explicit_scores=limit)
        kc, vc = cache[0].clone(), cache[1].clone()
        outs.append(backend.forward(q, k, v, (kc, vc), meta, head_dim**-0.5).float())
        assert (backend._plan.tiled is not None) == (path == "tiled")
        assert (backend._plan.prefills == []) == (path != "torch")
    tol = 1e-5 if dtype == torch.float32 else 2**-6 * max(1.0, outs[0].abs().max().item())
    for other in outs[1:]:
        err = (outs[0] - other).abs().max().item()
        assert err < tol, f"max abs diff {err}"
