"""Triton kernels: row reductions whose order depends on the row length only.

torch's CUDA reductions plan their split of a row (threads per row, rows per block,
blocks per row) from the whole tensor's shape, so a row's ``mean`` can be summed in
another order when the step has more rows. Here one program owns one row and walks
it in ``BLOCK`` chunks in order (each lane keeps its own partial sum; the lanes are
joined by one ``tl.sum`` of a fixed width), so a row's bits never depend on the rows
beside it.

* ``rms_norm``: HF's LlamaRMSNorm (normalise in fp32, round to the dtype, then scale
  by the weight in the dtype), as ``gpuworker/models/llama.py: rms_norm``.
* ``log_softmax``: of fp32 logits (the sampler's log-probabilities).

On CPU only under ``TRITON_INTERPRET=1`` (tests).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from inferq.kernels.runtime import check_launchable

MAX_BLOCK = 1024  # lanes a program walks a row with (fewer for a shorter row)


def _block(n: int) -> int:
    return min(MAX_BLOCK, triton.next_power_of_2(n))


@triton.jit(do_not_specialize=("num_rows",))
def _rms_norm_kernel(x_ptr, w_ptr, out_ptr, num_rows, n, stride_x, stride_o, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    x_row = x_ptr + row * stride_x
    squares = tl.zeros([BLOCK], tl.float32)
    for start in range(0, n, BLOCK):
        x = tl.load(x_row + start + cols, mask=start + cols < n, other=0.0).to(tl.float32)
        squares += x * x
    inv = 1.0 / tl.sqrt(tl.sum(squares, axis=0) / n + eps)
    for start in range(0, n, BLOCK):
        ok = start + cols < n
        x = tl.load(x_row + start + cols, mask=ok, other=0.0).to(tl.float32)
        normed = (x * inv).to(out_ptr.dtype.element_ty)
        w = tl.load(w_ptr + start + cols, mask=ok, other=0.0)
        # weight * normed in the dtype: the product in fp32, rounded once (torch's opmath)
        y = (w.to(tl.float32) * normed.to(tl.float32)).to(out_ptr.dtype.element_ty)
        tl.store(out_ptr + row * stride_o + start + cols, y, mask=ok)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``weight * (x.float() * rsqrt(mean(x.float()**2) + eps)).to(x.dtype)`` over the last dim,
    each row by one program in one order."""
    if weight.dim() != 1 or x.shape[-1] != weight.shape[0] or weight.dtype != x.dtype:
        raise ValueError(f"rms_norm: x [..., {x.shape[-1]}] {x.dtype} and weight {tuple(weight.shape)} {weight.dtype}")
    check_launchable(_rms_norm_kernel, x)
    n = x.shape[-1]
    x2 = x.reshape(-1, n)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    out = torch.empty((x2.shape[0], n), dtype=x.dtype, device=x.device)
    if x2.shape[0]:
        _rms_norm_kernel[(x2.shape[0],)](x2, weight, out, x2.shape[0], n, x2.stride(0), out.stride(0), eps,
                                         BLOCK=_block(n), num_warps=4)
    return out.view(x.shape)


@triton.jit(do_not_specialize=("num_rows",))
def _log_softmax_kernel(x_ptr, out_ptr, num_rows, n, stride_x, stride_o, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    x_row = x_ptr + row * stride_x
    top = tl.full([BLOCK], float("-inf"), tl.float32)
    for start in range(0, n, BLOCK):
        top = tl.maximum(top, tl.load(x_row + start + cols, mask=start + cols < n, other=float("-inf")).to(tl.float32))
    m = tl.max(top, axis=0)
    m_shift = tl.where(m == float("-inf"), 0.0, m)  # an all -inf row stays -inf, not NaN
    total = tl.zeros([BLOCK], tl.float32)
    for start in range(0, n, BLOCK):
        x = tl.load(x_row + start + cols, mask=start + cols < n, other=float("-inf")).to(tl.float32)
        total += tl.exp(x - m_shift)
    log_total = tl.log(tl.sum(total, axis=0))
    for start in range(0, n, BLOCK):
        ok = start + cols < n
        x = tl.load(x_row + start + cols, mask=ok, other=0.0).to(tl.float32)
        tl.store(out_ptr + row * stride_o + start + cols, x - m_shift - log_total, mask=ok)


def log_softmax(x: torch.Tensor) -> torch.Tensor:
    """fp32 ``log_softmax`` over the last dim, each row by one program in one order."""
    check_launchable(_log_softmax_kernel, x)
    n = x.shape[-1]
    x2 = x.reshape(-1, n)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    out = torch.empty((x2.shape[0], n), dtype=torch.float32, device=x.device)
    if x2.shape[0]:
        _log_softmax_kernel[(x2.shape[0],)](x2, out, x2.shape[0], n, x2.stride(0), out.stride(0),
                                            BLOCK=_block(n), num_warps=4)
    return out.view(x.shape)
