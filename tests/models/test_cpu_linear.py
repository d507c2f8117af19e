"""The small-batch CPU matmul kernels (gpuworker/models/cpu_linear.py) against
``F.linear``, alone and inside the model: bfloat16 on AMX or AVX512-BF16, float32 on
AVX-512 or AVX2+FMA."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from gpuworker.attention import cpu_kernels
from gpuworker.models import cpu_linear
from gpuworker.models.loader import load_model
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


def test_float32_row_results_do_not_depend_on_the_batch(lib):
    """A row's outputs are bit-identical whatever else is in the batch: the 14 x 32 kernel
    (up to 14 rows), the 6 x 64 one past that and its blocks of rows (K = 1,536 here makes
    them 60 rows) all sum each output in the same order. Greedy decoding must not change
    with the batch a request happens to share."""
    g = torch.Generator().manual_seed(11)
    w, b = torch.randn(128, 1536, generator=g), torch.randn(128, generator=g)
    packed = cpu_linear.PackedWeight(lib, w)
    x = torch.randn(min(300, packed.max_rows), 1536, generator=g)
    alone = torch.cat([packed(x[i:i + 1], b) for i in range(x.shape[0])])
    for rows in (2, 14, 15, 33, 61, 300):
        rows = min(rows, x.shape[0])
        assert torch.equal(packed(x[:rows], b), alone[:rows]), rows


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
    assert packed.larger is None and packed.max_rows >= 2048
    for rows in (1, 29, 131, 300):
        x = torch.randn(rows, 50, generator=g).to(torch.bfloat16)
        assert packed.applies(x, b)
        got, ref = packed(x, b).float(), F.linear(x, w, b).float()
        # fp32 sums rounded once to bf16 on both sides: at most one bf16 ulp apart.
        assert torch.equal(got, ref) or (got - ref).abs().max() <= ref.abs().max() * 2**-7, rows
    assert not cpu_linear.can_pack(lib, torch.randn(64, 51).to(torch.bfloat16))  # odd K: no k pairs


def test_larger_batches_and_other_shapes_stay_on_torch(lib):
    w = torch.randn(64, 64)
    packed = cpu_linear.PackedWeight(lib, w)
    assert packed.applies(torch.randn(packed.max_rows, 64))
    assert not packed.applies(torch.randn(packed.max_rows + 1, 64))
    assert not packed.applies(torch.randn(4, 64).to(torch.bfloat16))  # another dtype
    assert not packed.applies(torch.randn(4, 64), torch.randn(64).to(torch.bfloat16))
    assert not cpu_linear.can_pack(lib, torch.randn(48, 64))  # 48 rows: not a multiple of 32
    with pytest.raises(ValueError, match="multiples of 32"):
        cpu_linear.PackedWeight(lib, torch.randn(40, 64))
    before = torch.get_num_threads()
    torch.set_num_threads(2)  # the kernels run on torch's threads (OpenMP) or on one: either way they apply
    try:
        assert packed.applies(torch.randn(4, 64))
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_model_with_packed_weights_matches_the_plain_model(lib, dtype, tmp_path):
    """A tiny Llama through mixed prefill/decode steps: packed weights (decode-sized
    steps) and oneDNN (bf16) or F.linear (fp32) for larger ones, against the plain model."""
    _dtype_or_skip(lib, dtype)
    folder = save_tiny_model("llama", tmp_path / "m")
    plain = load_model(str(folder), dtype=dtype)
    seqs = sequences(plain.tokenizer)
    want = run_chunked(plain.model, seqs)
    packed = load_model(str(folder), dtype=dtype)
    # bf16: a small model keeps oneDNN's packing beside, for the steps past 32 rows
    # (bf16 on AMX; the AVX512-BF16 kernel runs every batch size)
    keep = dtype == torch.bfloat16 and lib.bf16 == "amx"
    kind = (lib.bf16 if dtype == torch.bfloat16 else lib.isa) + ("+onednn" if keep else "")
    assert packed.model.prepack_cpu_weights() == kind
    qkv = packed.model.layers[0].packed["qkv"]
    assert isinstance(qkv, cpu_linear.PackedWeight)
    assert (qkv.larger is not None) == keep
    for a, b in zip(run_chunked(packed.model, seqs), want):
        if dtype == torch.bfloat16:
            assert torch.equal(a, b) or (a - b).abs().max().item() < 0.05 * b.abs().max().item()
        else:
            assert (a - b).abs().max().item() < 1e-4  # the bound the fp32 HF comparison uses
    if dtype == torch.bfloat16:
        onednn = load_model(str(folder), dtype=dtype)
        assert onednn.model.prepack_cpu_weights(kernels=False) in ("onednn", None)
        for a, b in zip(run_chunked(onednn.model, seqs), want):
            assert torch.equal(a, b)
