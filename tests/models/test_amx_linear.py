"""The AMX matmul of decode-sized bfloat16 batches (gpuworker/models/amx_linear.py)
against ``F.linear``, alone and inside the model."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from gpuworker.attention import cpu_kernels
from gpuworker.models import amx_linear
from gpuworker.models.loader import load_model
from tests.models.test_model_vs_hf import run_chunked, sequences
from tests.tiny_models import save_tiny_model


@pytest.fixture
def lib():
    if not cpu_kernels.cpu_has("amx_tile", "amx_bf16", "avx512_bf16"):
        pytest.skip("this CPU has no AMX: bfloat16 matmuls use oneDNN's packing, tested with the model")
    before = torch.get_num_threads()
    torch.set_num_threads(1)  # the kernel is taken only with one torch thread
    got = amx_linear.load()
    # With AMX and a compiler, a failed build (or Linux refusing AMX) is a bug to see.
    assert got is not None or cpu_kernels.compiler() is None, "AMX CPU and a C compiler, but no AMX kernel"
    if got is None:
        pytest.skip("no C compiler on this machine: bfloat16 matmuls use oneDNN")
    yield got
    torch.set_num_threads(before)


@pytest.mark.parametrize("rows", [1, 3, 16, 17, 31, 32])
@pytest.mark.parametrize("bias", [False, True])
def test_amx_linear_equals_f_linear(lib, rows, bias):
    g = torch.Generator().manual_seed(rows)
    w = torch.randn(96, 160, generator=g).to(torch.bfloat16)
    b = torch.randn(96, generator=g).to(torch.bfloat16) if bias else None
    wide = torch.randn(rows, 200, generator=g).to(torch.bfloat16)
    x = wide[:, 20:180]  # a strided view (row stride 200), as a split of a fused projection gives
    packed = amx_linear.AmxWeight(lib, w)
    assert packed.applies(x)
    got = packed(x, b)
    ref = F.linear(x, w, b)
    # Same fp32 accumulation and one rounding to bf16: equal here, at most one ulp anywhere.
    assert torch.equal(got, ref) or (got.float() - ref.float()).abs().max() <= ref.float().abs().max() * 2**-7


def test_amx_linear_leaves_larger_batches_and_other_shapes_to_torch(lib):
    w = torch.randn(64, 64).to(torch.bfloat16)
    packed = amx_linear.AmxWeight(lib, w)
    assert not packed.applies(torch.randn(amx_linear.MAX_ROWS + 1, 64).to(torch.bfloat16))
    assert not packed.applies(torch.randn(4, 64))  # float32
    assert not amx_linear.can_pack(torch.randn(48, 64).to(torch.bfloat16))  # 48 rows: not a multiple of 32
    with pytest.raises(ValueError, match="multiples of 32"):
        amx_linear.AmxWeight(lib, torch.randn(40, 64).to(torch.bfloat16))


def test_model_with_amx_packing_equals_the_unpacked_model(lib, tmp_path):
    """A bf16 tiny Llama through mixed prefill/decode steps: AMX-packed weights (decode
    rows) and F.linear (larger steps) against the plain model; then the oneDNN packing."""
    folder = save_tiny_model("llama", tmp_path / "m")
    plain = load_model(str(folder), dtype=torch.bfloat16)
    seqs = sequences(plain.tokenizer)
    want = run_chunked(plain.model, seqs)
    packed = load_model(str(folder), dtype=torch.bfloat16)
    assert packed.model.prepack_cpu_weights() == "amx"
    assert isinstance(packed.model.layers[0].packed["qkv"], amx_linear.AmxWeight)
    for a, b in zip(run_chunked(packed.model, seqs), want):
        assert torch.equal(a, b) or (a - b).abs().max().item() < 0.05 * b.abs().max().item()
    onednn = load_model(str(folder), dtype=torch.bfloat16)
    assert onednn.model.prepack_cpu_weights(amx=False) in ("onednn", None)
    for a, b in zip(run_chunked(onednn.model, seqs), want):
        assert torch.equal(a, b)
