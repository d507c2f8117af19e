"""Batch-invariant mode of the Llama model on the GPU path (Triton attention backend).

On CUDA the model's plain torch ops are cuBLAS GEMMs (algorithm picked by M) and
torch reductions (split of a row planned from the whole tensor), so a row's hidden
states change with the number of rows in the step. Here every op that sums across
elements goes to a Triton kernel with one order per row (``inferq.kernels``
``batch_invariant_matmul`` and ``batch_invariant_rowwise``): the four projections of
every layer and the LM head, and every RMSNorm. The rest of the forward is
elementwise (rotary, SiLU-and-mul, residual adds, casts) or a gather (embedding), the
same per row whatever the batch. Attention is the backend's (its ``batch_invariant``).
"""
from __future__ import annotations

import torch

from inferq.kernels.batch_invariant_matmul import batch_invariant_linear
from inferq.kernels.batch_invariant_rowwise import rms_norm as invariant_rms_norm


class InvariantLinear:
    """A projection's weight behind the batch-invariant matmul; sits where ``linear`` takes a
    prepacked weight (``layer.packed``, ``packed_lm_head``) and keeps no copy of it."""

    def __init__(self, weight: torch.Tensor) -> None:
        self.weight = weight

    def __call__(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        return batch_invariant_linear(x, self.weight, bias)


def use_batch_invariant_kernels(model) -> bool:
    """Route a Llama's matmuls and RMSNorms to the batch-invariant Triton kernels; False,
    changing nothing, where its weights were prepacked for the CPU kernels (batch-invariant
    already) or its dtype has no kernel."""
    if getattr(model, "packing", None) is not None or model.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        return False
    for layer in model.layers:
        for name, attr in model._PROJECTIONS.items():
            if getattr(layer, attr) is not None:  # else quantized at load (a weight-only kernel, invariant too)
                layer.packed[name] = InvariantLinear(getattr(layer, attr))
        layer.rms_norm = invariant_rms_norm
    model.packed_lm_head = InvariantLinear(model.lm_head)
    return True
