"""The small-batch CPU matmul kernels (gpuworker/models/cpu_linear.py) against
``F.linear``, alone and inside the model: bfloat16 on AMX or AVX512-BF16, float32 on
AVX-512 or AVX2+FMA."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from inferq.gpuworker.attention import cpu_kernels
from inferq.gpuworker.models import cpu_linear, llama
from inferq.gpuworker.models.loader import load_model
from inferq.gpuworker.models.weight_memory import held_bytes, one_copy_bytes
from inferq.kernels.cpu import loader
from tests.models.test_model_vs_hf import run_chunked, sequences
from tests.tiny_models import save_tiny_model


@pytest.fixture
def lib():
    if not (cpu_kernels.cpu_has("avx512f") or cpu_kernels.cpu_has("avx2", "fma")):
        pytest.skip("this CPU has neither AVX-512 nor AVX2+FMA: matmuls stay on torch, tested with the model")
    before = torch.get_num_threads()
    torch.set_num_threads(1)  # the kernels are taken only with one torch thread
    got = cpu_linear.load()
    # With AVX-512 or AVX2 and a compiler, a failed build is a bug to see.
    assert got is not None or cpu_kernels.compiler() is None, "AVX-512/AVX2 CPU and a C compiler, but no matmul kernels"
    assert got is None or got.isa == ("avx512" if cpu_kernels.cpu_has("avx512f") else "avx2")
    if got is None:
        pytest.skip("no C compiler on this machine: matmuls stay on torch")
    yield got
    torch.set_num_threads(before)


def _dtype_or_skip(lib, dtype):
    if dtype == torch.bfloat16 and not lib.bf16:
        pytest.skip("neither AMX nor AVX512-BF16 on this CPU (or Linux refused AMX): inferq has no bf16 kernel "
                    "here and runs bf16 matmuls on oneDNN's packing, which the model tests cover")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("rows", [1, 3, 14, 15, 17, 32])
@pytest.mark.parametrize("bias", [False, True])
def test_kernel_matches_f_linear(lib, dtype, rows, bias):
    _dtype_or_skip(lib, dtype)
    g = torch.Generator().manual_seed(rows)
    w = torch.randn(96, 160, generator=g).to(dtype)
    b = torch.randn(96, generator=g).to(dtype) if bias else None
    wide = torch.randn(rows, 200, generator=g).to(dtype)
    x = wide[:, 20:180]  # a strided view (row stride 200), as a split of a fused projection gives
    packed = cpu_linear.PackedWeight(lib, w)
    assert packed.applies(x, b)
    got = packed(x, b)
    ref = F.linear(x, w, b)
    if dtype == torch.bfloat16:
        # Same fp32 accumulation and one rounding to bf16: equal here, at most one ulp anywhere.
        assert torch.equal(got, ref) or (got.float() - ref.float()).abs().max() <= ref.float().abs().max() * 2**-7
    else:
        # Another summation order than MKL's: both within float32 rounding of the exact result.
        exact = F.linear(x.double(), w.double(), None if b is None else b.double())
        err, ref_err = (got.double() - exact).abs().max().item(), (ref.double() - exact).abs().max().item()
        assert err <= max(4 * ref_err, 1e-5), (err, ref_err)


def test_float32_prompt_sized_steps(lib):
    """Past 64 rows (the AVX2 kernel, and the AVX-512 one off Intel, run prompt steps too):
    every row chunk, K not a multiple of the 64-long summation blocks, a bias, and (96
    columns) the AVX-512 kernel's pairs of 32-column panels past 14 rows plus an odd one."""
    g = torch.Generator().manual_seed(7)
    w, b = torch.randn(96, 200, generator=g), torch.randn(96, generator=g)
    packed = cpu_linear.PackedWeight(lib, w)
    for rows in sorted({min(131, packed.max_rows), min(packed.max_rows, 2048)}):
        x = torch.randn(rows, 200, generator=g)
        got, ref = packed(x, b), F.linear(x, w, b)
        exact = F.linear(x.double(), w.double(), b.double())
        err, ref_err = (got.double() - exact).abs().max().item(), (ref.double() - exact).abs().max().item()
        assert err <= max(4 * ref_err, 1e-5), (rows, err, ref_err)


def _kernel_at_every_batch_size(packed):
    """``packed`` with its kernel running every batch size: on Intel the float32 kernel stops at
    64 rows (MKL is faster past that there), but what these tests check is the kernel's own
    row blocking, which must hold on every CPU."""
    packed.max_rows = cpu_linear.ALL_ROWS
    return packed


def test_float32_row_results_do_not_depend_on_the_batch(lib):
    """A row's outputs are bit-identical whatever else is in the batch: the 14 x 32 kernel
    (up to 14 rows), the 6 x 64 one past that and its blocks of rows (K = 1,536 here makes
    them 60 rows) all sum each output in the same order. Greedy decoding must not change
    with the batch a request happens to share."""
    g = torch.Generator().manual_seed(11)
    w, b = torch.randn(128, 1536, generator=g), torch.randn(128, generator=g)
    packed = _kernel_at_every_batch_size(cpu_linear.PackedWeight(lib, w))
    x = torch.randn(300, 1536, generator=g)
    alone = torch.cat([packed(x[i:i + 1], b) for i in range(x.shape[0])])
    for rows in (2, 14, 15, 33, 61, 300):
        assert torch.equal(packed(x[:rows], b), alone[:rows]), rows


def _same_at_2_threads_and_within_fp32_rounding(packed, w, b, x, alone):
    """``packed(x, b)`` at 2 threads equals ``alone`` (each row computed alone at 1 thread), and
    ``alone`` is as close to the exact result as F.linear's fp32 rounding allows (4x margin)."""
    torch.set_num_threads(2)
    try:
        assert torch.equal(packed(x, b), alone)
    finally:
        torch.set_num_threads(1)
    exact = F.linear(x.double(), w.double(), b.double())
    ref_err = (F.linear(x, w, b).double() - exact).abs().max().item()
    assert (alone.double() - exact).abs().max().item() <= max(4 * ref_err, 1e-4)


def test_float32_weight_larger_than_l3_is_walked_panel_by_panel(lib):
    """A weight past 8 MB (the AVX2 kernel walks it panel by panel, each panel's row blocks in
    turn, instead of row block by row block): every row still equals that row alone, at 1 and 2
    threads, and F.linear within fp32 rounding."""
    g = torch.Generator().manual_seed(13)
    w, b = torch.randn(2048, 1088, generator=g), torch.randn(2048, generator=g)  # 8.9 MB
    packed = _kernel_at_every_batch_size(cpu_linear.PackedWeight(lib, w))
    x = torch.randn(100, 1088, generator=g)  # 30-row blocks at k = 1,088 on AVX2
    alone = torch.cat([packed(x[i:i + 1], b) for i in range(x.shape[0])])
    assert torch.equal(packed(x, b), alone)
    _same_at_2_threads_and_within_fp32_rounding(packed, w, b, x, alone)


def test_float32_wide_k_runs_in_slices_with_the_same_results(lib):
    """Past k = 2,048 the AVX-512 kernel walks k in 512-long slices inside 192-row blocks
    (Llama's down projection): every row still equals that row alone (the 14 x 32 kernel), at 1
    and 2 threads, with a partial last slice and k block (k = 2,600) and two row blocks; and
    F.linear within fp32 rounding."""
    g = torch.Generator().manual_seed(19)
    w, b = torch.randn(128, 2600, generator=g), torch.randn(128, generator=g)
    packed = _kernel_at_every_batch_size(cpu_linear.PackedWeight(lib, w))
    x = torch.randn(230, 2600, generator=g)
    alone = torch.cat([packed(x[i:i + 1], b) for i in range(x.shape[0])])
    for rows in (15, 100, x.shape[0]):
        assert torch.equal(packed(x[:rows], b), alone[:rows]), rows
    _same_at_2_threads_and_within_fp32_rounding(packed, w, b, x, alone)


def test_bfloat16_dot_product_kernel_takes_any_batch_and_even_k(lib, monkeypatch):
    """The AVX512-BF16 kernel (chosen on CPUs without AMX; tested on AMX ones too) runs
    prompt-sized steps, and any even K."""
    if not cpu_kernels.cpu_has("avx512f", "avx512_bf16"):
        pytest.skip("this CPU lacks AVX512-BF16: the vdpbf16ps instruction cannot run here "
                    "(its bf16 matmuls use AMX or oneDNN, tested above)")
    monkeypatch.setattr(lib, "bf16", "avx512_bf16")  # an AMX CPU would pick its tile kernel
    g = torch.Generator().manual_seed(11)
    w, b = torch.randn(64, 50, generator=g).to(torch.bfloat16), torch.randn(64, generator=g).to(torch.bfloat16)
    packed = cpu_linear.PackedWeight(lib, w)
    assert packed.max_rows >= 2048
    for rows in (1, 29, 131, 300):
        x = torch.randn(rows, 50, generator=g).to(torch.bfloat16)
        assert packed.applies(x, b)
        got, ref = packed(x, b).float(), F.linear(x, w, b).float()
        # fp32 sums rounded once to bf16 on both sides: at most one bf16 ulp apart.
        assert torch.equal(got, ref) or (got - ref).abs().max() <= ref.abs().max() * 2**-7, rows
    assert not cpu_linear.can_pack(lib, torch.randn(64, 51).to(torch.bfloat16))  # odd K: no k pairs


def test_bfloat16_wide_k_packs_x_with_the_same_results(lib, monkeypatch):
    """Past k = 1,170 (a 14-row chunk of x larger than L1) the AVX512-BF16 kernel packs x's k
    pairs chunk by chunk before the panels run: bit-identical to the kernel reading x's rows
    (``dp_linear_bf16_rows``), for a strided x, any batch (whole and partial 14-row chunks), a
    bias, and at 2 threads; every row equal to that row alone."""
    if not cpu_kernels.cpu_has("avx512f", "avx512_bf16"):
        pytest.skip("this CPU lacks AVX512-BF16: the vdpbf16ps instruction cannot run here")
    monkeypatch.setattr(lib, "bf16", "avx512_bf16")
    rows_fn = lib.dp_linear_bf16_rows
    rows_fn.argtypes, rows_fn.restype = lib.dp_linear_bf16.argtypes, lib.dp_linear_bf16.restype
    g = torch.Generator().manual_seed(17)
    k = 2048
    w = torch.randn(96, k, generator=g).to(torch.bfloat16)
    b = torch.randn(96, generator=g).to(torch.bfloat16)
    packed = cpu_linear.PackedWeight(lib, w)
    wide = torch.randn(45, k + 64, generator=g).to(torch.bfloat16)
    alone = torch.cat([packed(wide[i:i + 1, 32:32 + k], b) for i in range(45)])
    for rows in (1, 13, 14, 15, 29, 45):
        x = wide[:rows, 32:32 + k]  # row stride k + 64
        got = packed(x, b)
        want = torch.empty(rows, 96, dtype=torch.bfloat16)
        assert rows_fn(x.data_ptr(), x.stride(0), rows, packed.packed.data_ptr(), 96, k, b.data_ptr(),
                       want.data_ptr(), 96) == 0
        assert torch.equal(got, want), rows
        assert torch.equal(got, alone[:rows]), rows
    torch.set_num_threads(2)
    try:
        assert torch.equal(packed(wide[:, 32:32 + k], b), alone)
    finally:
        torch.set_num_threads(1)
    ref = F.linear(wide[:, 32:32 + k].float(), w.float(), b.float())
    assert (alone.float() - ref).abs().max() <= ref.abs().max() * 2**-6


@pytest.mark.parametrize("dtype,layout", [(torch.float32, "f32"), (torch.bfloat16, "avx512_bf16"),
                                          (torch.bfloat16, "amx")])
@pytest.mark.parametrize("inter,k", [(96, 160), (64, 1200), (32, 2600)])
def test_gate_up_with_silu_fused_gives_the_bits_of_the_matmul_then_silu_mul(lib, dtype, layout, inter, k,
                                                                             monkeypatch):
    """The MLP's gate|up weight packed with its gate and up panels interleaved: one kernel
    writes F.silu(gate) * up with the same bits as the plain kernel followed by the SiLU-and-mul
    kernel, for every batch (the narrow kernel, 6-row tiles in row blocks, bf16 with x's k pairs
    packed past k = 1,170, and fp32 past k = 2,048 where the kernel falls back to the matmul
    then SiLU-and-mul on the interleaved output), at 1 and 2 threads; every row equals that row
    alone. A plain call, rows() and unpacked() keep the weight's own column order. AMX (its
    32-row chunks, a zero-padded tail) takes k rounded up to whole 32-long tiles."""
    if layout == "avx512_bf16":
        if not cpu_kernels.cpu_has("avx512f", "avx512_bf16"):
            pytest.skip("this CPU lacks AVX512-BF16: the vdpbf16ps instruction cannot run here")
        monkeypatch.setattr(lib, "bf16", "avx512_bf16")  # an AMX CPU would pick its tile kernel
    if layout == "amx":
        if not lib.amx:
            pytest.skip("no AMX on this CPU (or Linux refused its tile state): the tile kernel cannot run here")
        k = -(-k // 32) * 32
    if layout not in getattr(lib, "silu_fused", {}):
        pytest.skip("no fused gate/up kernel here: it needs the AVX-512 build with BW and VL "
                    "(the model runs the matmul and SiLU-and-mul apart, tested above)")
    kernels = cpu_kernels.load()
    g = torch.Generator().manual_seed(inter + k)
    w = (torch.randn(2 * inter, k, generator=g) * k**-0.5).to(dtype)
    plain = _kernel_at_every_batch_size(cpu_linear.PackedWeight(lib, w))
    fused = _kernel_at_every_batch_size(cpu_linear.PackedGateUp(lib, w))
    assert torch.equal(fused.unpacked(), w)
    assert torch.equal(fused.rows(torch.tensor([0, inter, 2 * inter - 1])), w[[0, inter, 2 * inter - 1]])
    wide = torch.randn(130, k + 64, generator=g).to(dtype)
    alone = torch.cat([fused.silu_mul(wide[i:i + 1, 32:32 + k]) for i in range(130)])
    for rows in (1, 5, 14, 15, 20, 33, 45, 130):  # 130: past AMX's 96-row blocks at k = 2,624
        x = wide[:rows, 32:32 + k]  # row stride k + 64
        want = llama.silu_and_mul(plain(x, None), kernels)
        got = fused.silu_mul(x)
        assert got.shape == (rows, inter)
        assert torch.equal(got, want), rows
        assert torch.equal(got, alone[:rows]), rows
        assert torch.equal(fused(x, None), plain(x, None)), rows
    torch.set_num_threads(2)
    try:
        assert torch.equal(fused.silu_mul(wide[:, 32:32 + k]), alone)
    finally:
        torch.set_num_threads(1)
    gate, up = F.linear(wide[:, 32:32 + k].double(), w.double()).chunk(2, dim=-1)
    ref = F.silu(gate) * up
    assert (alone.double() - ref).abs().max() <= ref.abs().max() * (2**-6 if dtype == torch.bfloat16 else 1e-5)
    with pytest.raises(ValueError, match="does not fit"):
        fused.silu_mul(torch.randn(3, k + 1).to(dtype))
    assert not cpu_linear.can_fuse_gate_up(lib, torch.randn(96, k).to(dtype))  # I = 48: not whole panels


def test_past_max_rows_the_panels_still_serve(lib):
    """The packed weight is the only copy: past the kernel's max_rows (float32 on Intel and
    AVX2: prompt chunks) MKL reads the panels as a batch of matrices; a bf16 weight runs
    its kernel in chunks. Either way F.linear's results, bias included."""
    g = torch.Generator().manual_seed(5)
    for dtype in (torch.float32, torch.bfloat16):
        if dtype == torch.bfloat16 and not lib.bf16:
            continue
        w, b = torch.randn(96, 160, generator=g).to(dtype), torch.randn(96, generator=g).to(dtype)
        packed = cpu_linear.PackedWeight(lib, w)
        packed.max_rows = 8  # as if the kernel stopped at 8 rows
        x = torch.randn(40, 200, generator=g).to(dtype)[:, 20:180]
        assert packed.applies(x[:8], b) and not packed.applies(x, b)
        got, ref = packed(x, b).float(), F.linear(x, w, b).float()
        assert (got - ref).abs().max() <= ref.abs().max() * (2**-7 if dtype == torch.bfloat16 else 1e-6), dtype
        assert packed(x[:0], b).shape == (0, 96)


def test_other_shapes_and_dtypes_are_refused(lib):
    w = torch.randn(64, 64)
    packed = cpu_linear.PackedWeight(lib, w)
    assert packed.applies(torch.randn(packed.max_rows, 64))
    assert not packed.applies(torch.randn(packed.max_rows + 1, 64))
    assert not packed.applies(torch.randn(4, 64).to(torch.bfloat16))  # another dtype
    assert not packed.applies(torch.randn(4, 64), torch.randn(64).to(torch.bfloat16))
    with pytest.raises(TypeError, match="bfloat16"):
        packed(torch.randn(4, 64).to(torch.bfloat16), None)
    with pytest.raises(ValueError, match="does not fit"):
        packed(torch.randn(4, 32), None)
    assert not cpu_linear.can_pack(lib, torch.randn(48, 64))  # 48 rows: not a multiple of 32
    with pytest.raises(ValueError, match="multiples of 32"):
        cpu_linear.PackedWeight(lib, torch.randn(40, 64))
    before = torch.get_num_threads()
    torch.set_num_threads(2)  # the kernels run on torch's threads (OpenMP) or on one: either way they apply
    try:
        assert packed.applies(torch.randn(4, 64))
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("layout", ["f32", "avx512_bf16", "amx", "avx2"])
def test_rows_read_the_weight_back_from_every_layout(lib, layout, monkeypatch):
    """A tied embedding reads its rows out of the LM head's panels: exact copies, in every
    layout (the AMX and AVX2 ones are packed here without running their kernels)."""
    if layout == "avx2":
        avx2 = loader.build("linear_avx2", cpu_linear._FLAGS_AVX2)
        if avx2 is None:
            pytest.skip("the AVX2 kernel does not build here")
        cpu_linear.declare(avx2, "avx2")
        avx2.bf16 = None
        lib = avx2
    elif layout != "f32":
        if lib.isa != "avx512":
            pytest.skip("bf16 layouts are packed by the AVX-512 build")
        monkeypatch.setattr(lib, "bf16", layout)
    dtype = torch.float32 if layout in ("f32", "avx2") else torch.bfloat16
    w = torch.randn(96, 160, generator=torch.Generator().manual_seed(3)).to(dtype)
    packed = cpu_linear.PackedWeight(lib, w)
    assert packed.layout == ("f32" if dtype == torch.float32 else layout)
    ids = torch.tensor([[0, 95, 33], [33, 64, 17]])
    assert torch.equal(packed.rows(ids), w[ids.reshape(-1)])
    assert torch.equal(packed.unpacked(), w)
    if layout == "avx2":  # 16-column panels: the kernel and MKL on the panels past its max_rows
        x = torch.randn(packed.max_rows + 5, 160)
        assert (packed(x, None) - F.linear(x, w)).abs().max() <= 1e-4


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("tied", [False, True])
def test_model_with_packed_weights_matches_the_plain_model(lib, dtype, tied, tmp_path):
    """A tiny Llama through mixed prefill/decode steps: packed weights in place of the plain
    ones, against the plain model; the model then holds one copy of its weights (tied: the
    embedding's rows come out of the LM head's panels)."""
    _dtype_or_skip(lib, dtype)
    folder = save_tiny_model("llama", tmp_path / "m", tie_word_embeddings=tied)
    plain = load_model(str(folder), dtype=dtype)
    seqs = sequences(plain.tokenizer)
    want = run_chunked(plain.model, seqs)
    packed = load_model(str(folder), dtype=dtype)
    model = packed.model
    assert model.config.tie_word_embeddings == tied
    kind = lib.bf16 if dtype == torch.bfloat16 else lib.isa
    assert model.prepack_cpu_weights() == kind
    assert model.prepack_cpu_weights() == kind  # a second call changes nothing
    qkv = model.layers[0].packed["qkv"]
    assert isinstance(qkv, cpu_linear.PackedWeight)
    assert torch.equal(qkv.unpacked(), plain.model.layers[0].qkv_proj)
    gate_up = model.layers[0].packed["gate_up"]
    fusable = (cpu_linear.layout_of(lib, dtype) in getattr(lib, "silu_fused", {})
               and model.config.intermediate_size % 32 == 0)
    assert isinstance(gate_up, cpu_linear.PackedGateUp) == fusable
    assert torch.equal(gate_up.unpacked(), plain.model.layers[0].gate_up_proj)
    assert model.layers[0].qkv_proj is None and model.lm_head is None
    assert (model.embed_tokens is None) == tied
    assert held_bytes(model) <= 1.1 * one_copy_bytes(model)
    for a, b in zip(run_chunked(model, seqs), want):
        if dtype == torch.bfloat16:
            assert torch.equal(a, b) or (a - b).abs().max().item() < 0.05 * b.abs().max().item()
        else:
            assert (a - b).abs().max().item() < 1e-4  # the bound the fp32 HF comparison uses
    if dtype == torch.bfloat16:
        onednn = load_model(str(folder), dtype=dtype)
        assert onednn.model.prepack_cpu_weights(kernels=False) in ("onednn", None)
        if onednn.model.packing == "onednn":  # a tied LM head stays plain: its rows are the embedding
            assert onednn.model.layers[0].qkv_proj is None and (onednn.model.lm_head is None) == (not tied)
            assert held_bytes(onednn.model) <= 1.1 * one_copy_bytes(onednn.model)
        for a, b in zip(run_chunked(onednn.model, seqs), want):
            assert torch.equal(a, b)


def test_float16_panels_give_the_float32_panels_bits(lib):
    """AVX2: a float16 weight (a GGUF's F16) packs to half-width panels read by the float32
    kernel, the same products and sums as the float32 panels of its values, at any row count
    and thread count; rows() reads its values back. The AVX-512 build packs no float16 (its
    callers widen F16 to the engine's dtype: bf16 or float32 panels)."""
    w16 = (0.1 * torch.randn(96, 320)).half()
    if lib.isa != "avx2":
        assert not cpu_linear.can_pack(lib, w16)
        return
    assert lib.f16, "an AVX2 CPU without F16C"
    p16, p32 = cpu_linear.PackedWeight(lib, w16), cpu_linear.PackedWeight(lib, w16.float())
    assert p16.layout == "f16" and p16.dtype == torch.float32 and p16.nbytes * 2 == p32.nbytes
    bias = torch.randn(96)
    before = torch.get_num_threads()
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            for m in (1, 5, 64, 400):
                x = torch.randn(m, 320)
                assert torch.equal(p16(x, bias), p32(x, bias)), (threads, m)
    finally:
        torch.set_num_threads(before)
    assert torch.equal(p16.rows(torch.tensor([0, 17, 95])), w16.float()[[0, 17, 95]])
