"""The GGUF quantized matmul kernels (inferq_kernels/cpu/quant_linear.c) against their numpy
references (inferq_kernels/cpu/quant_reference.py), every type, both builds this CPU runs
(AVX512-VNNI and AVX2), both activation modes and both weight layouts.

Tolerances: the activation quantizer and the row lookup (the embedding) are bit-exact to the
reference. The int8-activation matmul sums the reference's exact products in float32, so it
stays within 1e-5 of the sum of their magnitudes (``quant_reference.error_bound``); it differs
from the unquantized-x product by x's int8 rounding, under 2% (relative L2) here. The float-
activation matmul is within the same 1e-5 bound of the exact float64 product. Each output's
arithmetic does not depend on the batch or the thread count: bit-identical rows and threads.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from inferq.gpuworker.models import quant_linear as ql
from inferq.kernels.cpu import quant_reference as ref

TYPES = list(ref.SUPPORTED)
ISAS = [isa for isa, flags in (("avx512_vnni", ("avx512f", "avx512bw", "avx512vl", "avx512_vnni", "f16c")),
                               ("avx2", ("avx2", "fma", "f16c"))) if ql.loader.cpu_has(*flags)]


def random_packed(name: str, n: int, k: int, seed: int = 0) -> torch.Tensor:
    """``[n, row_bytes]`` of valid ``name`` blocks: gguf's own quantizer where it has one, else
    random bytes with small finite f16 scales (any bit pattern is a valid K-quant block)."""
    from gguf import GGMLQuantizationType
    from gguf.quants import quantize

    qtype = GGMLQuantizationType[name]
    rng = np.random.default_rng(seed)
    elems, nbytes = ref.block_shape(int(qtype))
    if name in ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0"):
        w = (rng.standard_normal((n, k)) * 0.05).astype(np.float32)
        return torch.from_numpy(np.ascontiguousarray(quantize(w, qtype)))
    raw = rng.integers(0, 256, size=(n, k // elems, nbytes), dtype=np.uint8)

    def f16(shape):
        return rng.uniform(5e-4, 2e-3, size=shape).astype(np.float16).view(np.uint8).reshape(*shape, 2)

    if name in ("Q4_K", "Q5_K"):  # d, dmin first
        raw[..., 0:2], raw[..., 2:4] = f16(raw.shape[:2]), f16(raw.shape[:2])
    else:  # Q6_K: d last
        raw[..., nbytes - 2:] = f16(raw.shape[:2])
    return torch.from_numpy(raw.reshape(n, -1))


def shape_for(name: str) -> tuple[int, int]:
    """(n, k): n not a multiple of the 4-row tile or the 16-row group, k a multiple of the block only."""
    return 37, (512 if name.endswith("_K") else 96)


def linear(isa: str, name: str, packed: torch.Tensor, k: int, activations: str) -> ql.QuantLinear:
    return ql.QuantLinear(ql.load(isa), [ql.QuantWeight(packed, ref.SUPPORTED[name], k)], torch.float32, activations)


@pytest.fixture(params=ISAS)
def isa(request):
    if ql.load(request.param) is None:
        pytest.skip(f"the {request.param} build of quant_linear.c is unavailable (no C compiler?)")
    return request.param


@pytest.mark.parametrize("m", [1, 5])
def test_activation_quantizer_is_bit_exact(isa, m):
    x = torch.randn(m, 160) * torch.logspace(-3, 2, 160)  # blocks of very different scales
    x[0, :32] = 0  # an all-zero block: d = 0, q = 0
    for got, want in zip(ql.quantize_x(ql.load(isa), x), ref.quantize_activations(x)):
        assert torch.equal(got, want)
    xb = x.bfloat16()
    for got, want in zip(ql.quantize_x(ql.load(isa), xb), ref.quantize_activations(xb)):
        assert torch.equal(got, want)


@pytest.mark.parametrize("name", TYPES)
@pytest.mark.parametrize("activations", ["int8", "float"])
def test_matmul_matches_reference(isa, name, activations):
    n, k = shape_for(name)
    qtype = ref.SUPPORTED[name]
    packed = random_packed(name, n, k)
    lin = linear(isa, name, packed, k, activations)
    exact = ref.float_linear
    for m in (1, 6, 64):
        x = torch.randn(m, k)
        y = lin(x).double()
        if activations == "int8":
            want, bound = ref.quant_linear(x, packed, qtype, k), ref.error_bound(x, packed, qtype, k)
            assert ((y - want).abs() <= bound).all(), ((y - want).abs() / bound).max()
            plain = exact(x, packed, qtype, k)
            assert (y - plain).norm() / plain.norm() < 0.02  # x's int8 rounding
        else:
            want = exact(x, packed, qtype, k)
            bound = 1e-5 * (x.double().abs() @ torch.from_numpy(ref.dequantize(packed, qtype, k)).double().abs().T)
            assert ((y - want).abs() <= bound).all()


@pytest.mark.parametrize("name", TYPES)
@pytest.mark.parametrize("activations", ["int8", "float"])
def test_rows_batch_and_threads_give_identical_bits(isa, name, activations):
    n, k = shape_for(name)
    lin = linear(isa, name, random_packed(name, n, k, seed=1), k, activations)
    assert_batch_invariant(lin, torch.randn(100, k))


def assert_batch_invariant(lin: ql.QuantLinear, x: torch.Tensor) -> None:
    """Each row of x's 100 gives the same bits alone (a decode step), in batches of 4, 7, 8, 17
    and 64 rows (the register tiles; the many-row scratch tiles, AMX's 16 rows where it runs)
    and on 2 threads."""
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        full = lin(x)
        for i in range(x.shape[0]):
            assert torch.equal(lin(x[i:i + 1]), full[i:i + 1]), i
        for a, b in ((2, 6), (0, 7), (30, 38), (10, 27), (0, 64), (36, 100)):
            assert torch.equal(lin(x[a:b]), full[a:b]), (a, b)
        torch.set_num_threads(2)
        assert torch.equal(lin(x), full)
        assert torch.equal(lin(x[:64]), full[:64])
        assert torch.equal(lin(x[3:4]), full[3:4])
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("name", TYPES)
def test_many_rows_over_a_long_k_match_and_are_invariant(isa, name):
    """k of 35 or 40 blocks: the many-row kernel's slices of k (32 blocks) end inside k; 300
    rows: more than one pass of rows of x (256) over the weights."""
    n, k = 37, (1280 if name.endswith("_K") else 1120)
    qtype = ref.SUPPORTED[name]
    packed = random_packed(name, n, k, seed=4)
    lin = linear(isa, name, packed, k, "int8")
    x = torch.randn(300, k)
    y = lin(x)
    want, bound = ref.quant_linear(x, packed, qtype, k), ref.error_bound(x, packed, qtype, k)
    assert ((y.double() - want).abs() <= bound).all()
    for a, b in ((0, 100), (250, 300), (299, 300)):
        assert torch.equal(lin(x[a:b]), y[a:b]), (a, b)
    assert_batch_invariant(lin, x[:100])


@pytest.mark.parametrize("name", TYPES)
def test_many_rows_without_amx_give_the_same_bits(name):
    """The scratch tiles' vector dot products (CPUs without AMX) against AMX's: the same int32
    sums, the same float operations."""
    if "avx512_vnni" not in ISAS or not ql.load("avx512_vnni").quant_amx(-1):
        pytest.skip("needs AMX (the vector tiles run everywhere else and are tested there)")
    lib = ql.load("avx512_vnni")
    n, k = 37, (1280 if name.endswith("_K") else 1120)
    lin = linear("avx512_vnni", name, random_packed(name, n, k, seed=5), k, "int8")
    x = torch.randn(100, k)
    with_amx = lin(x)
    try:
        assert lib.quant_amx(0) == 0
        assert torch.equal(lin(x), with_amx)
        assert_batch_invariant(lin, x)
    finally:
        lib.quant_amx(1)


@pytest.mark.parametrize("name", TYPES)
def test_bfloat16_in_and_out_is_the_float32_result_rounded(isa, name):
    n, k = shape_for(name)
    packed = random_packed(name, n, k, seed=2)
    x = torch.randn(3, k).bfloat16()
    for activations in ("int8", "float"):
        lin = linear(isa, name, packed, k, activations)
        y = lin(x)
        assert y.dtype == torch.bfloat16
        assert torch.equal(y, lin(x.float()).bfloat16())


@pytest.mark.parametrize("name", TYPES)
def test_row_lookup_is_the_dequantized_table(isa, name):
    n, k = shape_for(name)
    packed = random_packed(name, n, k, seed=3)
    ids = torch.tensor([0, 36, 5, 5, 17])
    want = ref.quant_rows(packed, ref.SUPPORTED[name], k, ids)
    for activations in ("int8", "float"):  # int8 may hold the table repacked in 16-row groups
        lin = linear(isa, name, packed, k, activations)
        assert torch.equal(lin.rows(ids), want)
    lin = ql.QuantLinear(ql.load(isa), [ql.QuantWeight(packed, ref.SUPPORTED[name], k)], torch.bfloat16, "int8")
    assert torch.equal(lin.rows(ids), want.bfloat16())
    for bad in ([0, n], [-1]):  # the kernel checks the ids against the table
        with pytest.raises(IndexError, match=f"table of {n} rows"):
            lin.rows(torch.tensor(bad))


def test_fused_segments_of_mixed_types_write_their_columns(isa):
    """q|k|v of a Q4_K_M file: Q4_K rows then Q6_K rows, one output."""
    k = 256
    parts = [("Q4_K", 20), ("Q6_K", 12), ("Q8_0", 9)]
    packed = [random_packed(name, n, k, seed=i) for i, (name, n) in enumerate(parts)]
    lib = ql.load(isa)
    x = torch.randn(3, k)
    for activations in ("int8", "float"):
        fused = ql.QuantLinear(lib, [ql.QuantWeight(p, ref.SUPPORTED[name], k) for p, (name, _) in zip(packed, parts)],
                               torch.float32, activations)
        alone = [ql.QuantLinear(lib, [ql.QuantWeight(p, ref.SUPPORTED[name], k)], torch.float32, activations)(x)
                 for p, (name, _) in zip(packed, parts)]
        assert torch.equal(fused(x), torch.cat(alone, dim=1))


@pytest.mark.parametrize("name", TYPES)
def test_x16_layout_is_used_where_it_runs(isa, name):
    """Both builds run int8 activations on the 16-row layout (AVX512-VNNI: one vpdpbusd for
    16 rows; AVX2: two vpmaddubsw halves of 8); float activations keep the file's rows."""
    n, k = shape_for(name)
    assert ql.load(isa).repack16
    assert linear(isa, name, random_packed(name, n, k), k, "int8").segments[0].layout == "x16"
    assert linear(isa, name, random_packed(name, n, k), k, "float").segments[0].layout == "rows"


def test_unsupported_type_is_refused_with_its_name():
    raw = torch.zeros(4, 84, dtype=torch.uint8)  # Q2_K: 84 bytes per 256
    with pytest.raises(ValueError, match=r"Q2_K \(tensor 'blk.0.ffn_up.weight'\) has no native CPU kernel"):
        ql.QuantWeight(raw, 10, 256, "blk.0.ffn_up.weight")


def test_bad_shapes_are_refused(isa):
    packed = random_packed("Q4_1", 8, 64)
    with pytest.raises(ValueError, match="do not hold rows"):
        ql.QuantWeight(packed, ref.SUPPORTED["Q4_1"], 96)
    lin = linear(isa, "Q4_1", packed, 64, "int8")
    with pytest.raises(ValueError, match="does not fit"):
        lin(torch.randn(2, 96))
