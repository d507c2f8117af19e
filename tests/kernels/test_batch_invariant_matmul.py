"""The batch-invariant Triton matmul (interpreted on CPU, compiled on a GPU): a row's output
has the same bits at M = 1, 3 and 17 (whatever rows share its tile or its launch), and
equals the plain-torch reference within a rounding of the dtype.

Shapes are off the tiles on purpose: K = 80 is 1.25 K-tiles in half precision and 2.5 in
fp32, N = 96 is 1.5 N-tiles, 17 rows are a partial M-tile.
"""
from __future__ import annotations

import pytest
import torch

from inferq.kernels.batch_invariant_matmul import batch_invariant_linear, reference_linear
from tests.kernels.conftest import DEVICE

N, K = 96, 80
# One rounding of the output (the reference rounds once too), on outputs of magnitude ~sqrt(K).
TOLERANCE = {torch.float32: dict(atol=1e-5, rtol=1e-5), torch.float16: dict(atol=1e-2, rtol=2e-3),
             torch.bfloat16: dict(atol=8e-2, rtol=1.6e-2)}


def operands(dtype, bias: bool, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(17, K, generator=g).to(dtype).to(DEVICE)
    w = torch.randn(N, K, generator=g).to(dtype).to(DEVICE)
    b = torch.randn(N, generator=g).to(dtype).to(DEVICE) if bias else None
    return x, w, b


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=["fp32", "fp16", "bf16"])
@pytest.mark.parametrize("bias", [False, True], ids=["no_bias", "bias"])
def test_a_rows_bits_do_not_depend_on_the_row_count(dtype, bias):
    x, w, b = operands(dtype, bias)
    all17 = batch_invariant_linear(x, w, b)
    rows = [5, 0, 16]
    three = batch_invariant_linear(x[rows], w, b)
    one = batch_invariant_linear(x[5:6], w, b)
    assert torch.equal(three, all17[rows])
    assert torch.equal(one, all17[5:6])
    torch.testing.assert_close(all17.cpu().float(), reference_linear(x, w, b).cpu().float(), **TOLERANCE[dtype])


def test_the_reference_is_f_linear_up_to_rounding():
    x, w, b = operands(torch.float32, True)
    torch.testing.assert_close(reference_linear(x, w, b), torch.nn.functional.linear(x, w, b), atol=1e-5, rtol=1e-5)


def test_strided_and_batched_inputs_and_no_rows():
    x, w, _ = operands(torch.float32, False)
    wide = torch.cat([x, x], dim=1)[:, :K]  # a strided view, as q/k/v sliced out of a projection
    assert not wide.is_contiguous()
    assert torch.equal(batch_invariant_linear(wide, w), batch_invariant_linear(x, w))
    assert torch.equal(batch_invariant_linear(x.view(1, 17, K), w)[0], batch_invariant_linear(x, w))
    assert batch_invariant_linear(x[:0], w).shape == (0, N)


def test_bad_operands_are_clear_errors():
    x, w, _ = operands(torch.float32, False)
    with pytest.raises(ValueError, match="one dtype"):
        batch_invariant_linear(x, w.to(torch.bfloat16))
    with pytest.raises(ValueError, match="does not match weight"):
        batch_invariant_linear(x[:, :40], w)
    with pytest.raises(ValueError, match="bias"):
        batch_invariant_linear(x, w, torch.zeros(N + 1, device=DEVICE))
