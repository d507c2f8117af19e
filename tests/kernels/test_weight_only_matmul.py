"""The weight-only quantized Triton matmul (fp8 e4m3, int8, int4; interpreted on CPU, compiled
on a GPU) against its plain-torch reference, and a row's bits at M = 1, 3 and 17.

The quantizers are checked on their own too: dequantized weights sit within half a step of
the original (absmax scales), and int4 packs two values a byte.
Shapes are off the tiles: N = 96 is 1.5 N-tiles, 17 rows a partial M-tile; K = 128 holds
two int4 groups of 64.
"""
from __future__ import annotations

import pytest
import torch

from inferq.kernels.weight_only_matmul import (
    FP8_MAX, dequantize_weight, quantize_weight, reference_linear, weight_only_linear,
)
from tests.kernels.conftest import DEVICE

N, K, GROUP = 96, 128, 64
# The kernel multiplies the scale into fp32 sums, the reference into the weight: a rounding
# or two of the output's dtype apart on outputs of magnitude ~sqrt(K).
TOLERANCE = {torch.float32: dict(atol=1e-4, rtol=1e-4), torch.float16: dict(atol=2e-2, rtol=4e-3),
             torch.bfloat16: dict(atol=1.2e-1, rtol=2.4e-2)}
KINDS = ["fp8", "int8", "int4"]
DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def operands(dtype, kind, bias: bool, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(17, K, generator=g).to(dtype)
    w = torch.randn(N, K, generator=g) * torch.linspace(0.1, 3.0, N)[:, None]  # channels of different ranges
    qw = quantize_weight(w, kind, group_size=GROUP)
    b = torch.randn(N, generator=g).to(dtype) if bias else None
    return x.to(DEVICE), qw.to(DEVICE), (b.to(DEVICE) if b is not None else None), w


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=["fp32", "fp16", "bf16"])
def test_matches_the_reference_and_a_rows_bits_do_not_depend_on_the_row_count(kind, dtype):
    x, qw, b, _ = operands(dtype, kind, bias=(kind == "int8"))
    all17 = weight_only_linear(x, qw, b)
    rows = [5, 0, 16]
    assert torch.equal(weight_only_linear(x[rows], qw, b), all17[rows])
    assert torch.equal(weight_only_linear(x[5:6], qw, b), all17[5:6])
    torch.testing.assert_close(all17.cpu().float(), reference_linear(x, qw, b).cpu().float(), **TOLERANCE[dtype])


@pytest.mark.parametrize("kind", KINDS)
def test_quantized_weights_are_within_half_a_step(kind):
    _, qw, _, w = operands(torch.float32, kind, bias=False)
    back = dequantize_weight(qw.to("cpu"))
    if kind == "int4":
        step = qw.scales.cpu().repeat_interleave(GROUP, dim=1)
        assert qw.values.shape == (N, K // 2) and qw.values.dtype == torch.uint8
        assert (back - w).abs().le(step / 2 + 1e-6).all()
    elif kind == "int8":
        step = qw.scales.cpu()[:, None]
        assert (back - w).abs().le(step / 2 + 1e-6).all()
    else:  # e4m3: 3 mantissa bits, a relative step of 2^-3 at most
        assert qw.values.dtype == torch.float8_e4m3fn
        assert (back - w).abs().le(w.abs() * 2 ** -4 + qw.scales.cpu()[:, None] * 2 ** -9).all()
        assert back.abs().amax(dim=1).sub(w.abs().amax(dim=1)).abs().le(1e-5 * FP8_MAX).all()
    # a quarter (int4) or half (8-bit) the bytes of bf16, scales included
    assert qw.nbytes() <= N * K * 2 * (0.3 if kind == "int4" else 0.52)


def test_no_rows_and_leading_dims():
    x, qw, _, _ = operands(torch.float32, "int8", bias=False)
    assert weight_only_linear(x[:0], qw).shape == (0, N)
    batched = weight_only_linear(x.view(1, 17, K), qw)
    assert torch.equal(batched[0], weight_only_linear(x, qw))


def test_bad_operands_are_refused_with_a_reason():
    x, qw, _, _ = operands(torch.float32, "int4", bias=False)
    with pytest.raises(ValueError, match="input features"):
        weight_only_linear(x[:, :64], qw)
    with pytest.raises(ValueError, match="activations"):
        weight_only_linear(x.to(torch.float64), qw)
    with pytest.raises(ValueError, match="multiple"):
        quantize_weight(torch.randn(4, 100), "int4", group_size=64)
    with pytest.raises(ValueError, match="unknown weight quantization"):
        quantize_weight(torch.randn(4, 64), "int3")
