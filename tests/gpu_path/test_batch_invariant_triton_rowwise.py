"""The batch-invariant row kernels (interpreted on CPU, compiled on a GPU): RMSNorm and
log-softmax give a row the same bits at 1, 3 and 17 rows, and the torch values within a
rounding (RMSNorm: the model's own ``rms_norm``, HF's formula)."""
from __future__ import annotations

import pytest
import torch

from inferq.gpuworker.models.llama import rms_norm as torch_rms_norm
from inferq.kernels.batch_invariant_rowwise import MAX_BLOCK, log_softmax, rms_norm
from tests.kernels.conftest import DEVICE


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("hidden", [72, MAX_BLOCK + 200], ids=["one_block", "two_blocks"])
def test_rms_norm_rows_do_not_depend_on_the_row_count(dtype, hidden):
    g = torch.Generator().manual_seed(hidden)
    x = (torch.randn(17, hidden, generator=g) * 3).to(dtype).to(DEVICE)
    w = (1 + torch.randn(hidden, generator=g) / 4).to(dtype).to(DEVICE)
    all17 = rms_norm(x, w, 1e-6)
    assert torch.equal(rms_norm(x[[5, 0, 16]], w, 1e-6), all17[[5, 0, 16]])
    assert torch.equal(rms_norm(x[5:6], w, 1e-6), all17[5:6])
    bound = dict(atol=1e-5, rtol=1e-5) if dtype == torch.float32 else dict(atol=2e-2, rtol=2e-2)  # two roundings (the interpreter truncates)
    torch.testing.assert_close(all17.float(), torch_rms_norm(x, w, 1e-6).float(), **bound)
    heads = x[:, : hidden // 8 * 8].reshape(17, 8, -1)  # per-head q/k norm (Qwen3): [T, H, D]
    torch.testing.assert_close(rms_norm(heads, w[: heads.shape[-1]], 1e-6).float(),
                               torch_rms_norm(heads, w[: heads.shape[-1]], 1e-6).float(), **bound)


def test_log_softmax_rows_do_not_depend_on_the_row_count():
    g = torch.Generator().manual_seed(0)
    x = (torch.randn(17, 1500, generator=g) * 5).to(DEVICE)
    x[3, 100:] = float("-inf")  # masked logits (a grammar) keep their -inf
    all17 = log_softmax(x)
    assert torch.equal(log_softmax(x[[5, 3, 16]]), all17[[5, 3, 16]])
    assert torch.equal(log_softmax(x[5:6]), all17[5:6])
    torch.testing.assert_close(all17, torch.log_softmax(x, dim=-1), atol=1e-5, rtol=1e-5)
