"""Plain numpy/torch references of quant_linear.c (the kernels on GGUF-quantized weights).

A weight is ``packed``: a uint8 tensor ``[n, row_bytes]``, each row its GGUF blocks as they
lie in the file; ``qtype`` its ggml type id (``gguf.GGMLQuantizationType``). The reference
dequantizers are the ``gguf`` package's numpy ones.

* ``quantize_activations``: the kernels' int8 activation blocks, exactly (the same float32
  operations, rounding half to even): the C must match it bit for bit.
* ``quant_linear``: ``x @ W^T`` with x as the kernels quantize it and W dequantized, summed in
  float64. The C sums the same products in float32 (block by block, lane by lane), so it
  agrees to float32 rounding: within ``1e-5`` of the sum of the products' magnitudes.
* ``float_linear``: ``x @ W^T`` with x unquantized, in float64: what the int8 activations
  approximate (about 1% of the output's scale; llama.cpp makes the same approximation).
* ``quant_rows``: rows of W dequantized (the embedding); the C is bit-exact to it.
"""
from __future__ import annotations

import numpy as np
import torch

# The types quant_linear.c runs (ggml type ids, as gguf.GGMLQuantizationType numbers them)
SUPPORTED = {"Q4_0": 2, "Q4_1": 3, "Q5_0": 6, "Q5_1": 7, "Q8_0": 8, "Q4_K": 12, "Q5_K": 13, "Q6_K": 14}
BLOCK = 32  # activations are quantized in blocks of this many elements


def type_name(qtype: int) -> str:
    from gguf import GGMLQuantizationType

    try:
        return GGMLQuantizationType(qtype).name
    except ValueError:
        return f"ggml type {qtype}"


def block_shape(qtype: int) -> tuple[int, int]:
    """(elements, bytes) of one block of ``qtype``."""
    from gguf import GGMLQuantizationType
    from gguf.constants import GGML_QUANT_SIZES

    return GGML_QUANT_SIZES[GGMLQuantizationType(qtype)]


def dequantize(packed: torch.Tensor | np.ndarray, qtype: int, k: int) -> np.ndarray:
    """The whole weight ``[n, k]`` as float32 (gguf's dequantizer)."""
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize as gguf_dequantize

    raw = packed.numpy() if isinstance(packed, torch.Tensor) else packed
    return np.asarray(gguf_dequantize(raw, GGMLQuantizationType(qtype)), dtype=np.float32).reshape(-1, k)


def quantize_activations(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``x [m, k]`` (float32 or bfloat16) -> (q int8 ``[m, k]``, d float32 ``[m, k/32]``,
    s float32 ``[m, k/32, 4]``: d * the sum of q over elements 0-15, 16-31 and all 32, then 0)."""
    v = x.float().numpy().reshape(x.shape[0], -1, BLOCK)
    amax = np.abs(v).max(axis=-1)
    d = (amax / np.float32(127.0)).astype(np.float32)
    with np.errstate(divide="ignore"):
        inv = np.where(d != 0, np.float32(1.0) / d, np.float32(0.0)).astype(np.float32)
    q = np.rint(v * inv[..., None]).astype(np.int8)
    q32 = q.astype(np.int32)
    s0, s1 = q32[..., :16].sum(-1), q32[..., 16:].sum(-1)
    s = np.stack([d * s0.astype(np.float32), d * s1.astype(np.float32), d * (s0 + s1).astype(np.float32),
                  np.zeros_like(d)], axis=-1)
    return (torch.from_numpy(q.reshape(x.shape[0], -1)), torch.from_numpy(d), torch.from_numpy(s.astype(np.float32)))


def quant_linear(x: torch.Tensor, packed: torch.Tensor, qtype: int, k: int) -> torch.Tensor:
    """``x @ W^T`` as the kernels compute it, in float64: x quantized to int8 blocks."""
    q, d, _ = quantize_activations(x)
    xf = q.double().view(x.shape[0], -1, BLOCK) * d.double()[..., None]
    w = torch.from_numpy(dequantize(packed, qtype, k)).double()
    return xf.view(x.shape[0], k) @ w.T


def error_bound(x: torch.Tensor, packed: torch.Tensor, qtype: int, k: int) -> torch.Tensor:
    """The float32 summation bound the kernels keep to: 1e-5 of ``|x_q| @ |W|^T``."""
    q, d, _ = quantize_activations(x)
    xf = (q.double().view(x.shape[0], -1, BLOCK) * d.double()[..., None]).view(x.shape[0], k)
    w = torch.from_numpy(dequantize(packed, qtype, k)).double()
    return 1e-5 * (xf.abs() @ w.abs().T) + 1e-30


def float_linear(x: torch.Tensor, packed: torch.Tensor, qtype: int, k: int) -> torch.Tensor:
    """``x @ W^T`` in float64 with x as given: the exact value the int8 path approximates."""
    return x.double() @ torch.from_numpy(dequantize(packed, qtype, k)).double().T


def quant_rows(packed: torch.Tensor, qtype: int, k: int, ids: torch.Tensor) -> torch.Tensor:
    """Rows ``ids`` of W as float32."""
    rows = packed[ids.reshape(-1)]
    return torch.from_numpy(dequantize(rows, qtype, k).copy())
