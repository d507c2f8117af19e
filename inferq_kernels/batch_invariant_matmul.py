"""Triton kernel: a matmul whose rows do not depend on how many rows there are.

``out[M, N] = x[M, K] @ weight[N, K]^T (+ bias)``, the shape of ``F.linear``. cuBLAS picks
its algorithm (tile shape, split-K, stream-K) from M, so a row of a 1-row decode and the
same row in a 300-row prompt step are summed in different orders and differ in the last
bits; a model's greedy answer then changes with its batch. Here the tile shape and the
K walk are constants of the dtype: every output is one tile's fp32 accumulator, fed
``BLOCK_K`` columns at a time in increasing k, the bias added once after, rounded once.
A row's bits then depend on that row and the weight alone (rows past M are zeros in the
tile and never mix into other rows: a dot's output row reads only its own input row).

Persistent: ``min(tiles, compute units)`` programs walk the output tiles in a fixed
stride; which program computes a tile never changes its arithmetic.

On CPU this only runs under ``TRITON_INTERPRET=1`` (tests), with the dots in fp32 (numpy
has no bf16 matmul; operands are already rounded to their dtype).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from inferq.kernels.runtime import KernelLaunch, check_launchable, num_compute_units

DTYPES = (torch.float32, torch.float16, torch.bfloat16)


@triton.jit
def _dot(a, b, IN_FP32: tl.constexpr):
    # fp32 inputs: exact fp32 (no TF32); on the CPU interpreter for every dtype (see module doc).
    if IN_FP32:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    else:
        return tl.dot(a, b)


# M, and with it the program count, change every step: neither may key a compile (1-3 s each).
@triton.jit(do_not_specialize=("M", "num_programs"))
def _batch_invariant_matmul_kernel(
    x_ptr, w_ptr, bias_ptr, out_ptr,
    M, N, K, num_programs,
    stride_xm, stride_xk,
    stride_wn, stride_wk,
    stride_om, stride_on,
    HAS_BIAS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    DOT_IN_FP32: tl.constexpr,
):
    n_tiles = tl.cdiv(N, BLOCK_N)
    num_tiles = tl.cdiv(M, BLOCK_M) * n_tiles
    k_steps = tl.cdiv(K, BLOCK_K)
    rk = tl.arange(0, BLOCK_K)
    for tile in range(tl.program_id(0), num_tiles, num_programs):
        rm = (tile // n_tiles) * BLOCK_M + tl.arange(0, BLOCK_M)
        rn = (tile % n_tiles) * BLOCK_N + tl.arange(0, BLOCK_N)
        m_ok = rm < M
        n_ok = rn < N
        x_rows = x_ptr + rm.to(tl.int64)[:, None] * stride_xm
        w_cols = w_ptr + rn.to(tl.int64)[None, :] * stride_wn
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        for step in range(0, k_steps):  # in order: the one K walk of every row
            k = step * BLOCK_K + rk
            k_ok = k < K
            x = tl.load(x_rows + k[None, :] * stride_xk, mask=m_ok[:, None] & k_ok[None, :], other=0.0)
            w = tl.load(w_cols + k[:, None] * stride_wk, mask=k_ok[:, None] & n_ok[None, :], other=0.0)
            acc += _dot(x, w, DOT_IN_FP32)
        if HAS_BIAS:
            acc += tl.load(bias_ptr + rn, mask=n_ok, other=0.0).to(tl.float32)[None, :]
        tl.store(
            out_ptr + rm.to(tl.int64)[:, None] * stride_om + rn[None, :] * stride_on,
            acc.to(out_ptr.dtype.element_ty),
            mask=m_ok[:, None] & n_ok[None, :],
        )


def tile_config(dtype: torch.dtype) -> dict:
    """The tile shape and launch options of a dtype: constants, never a function of M.
    Half precision: 64-row tiles (Hopper's wgmma takes 64 rows a warp group); fp32 (IEEE
    dots, twice the registers) smaller."""
    if dtype == torch.float32:
        return dict(BLOCK_M=32, BLOCK_N=64, BLOCK_K=32, num_warps=4, num_stages=2)
    return dict(BLOCK_M=64, BLOCK_N=64, BLOCK_K=64, num_warps=4, num_stages=3)


def check_matmul(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
    if x.dtype not in DTYPES or weight.dtype != x.dtype:
        raise ValueError(f"batch-invariant matmul takes fp32/fp16/bf16 x and weight of one dtype, "
                         f"got {x.dtype} and {weight.dtype}")
    if weight.dim() != 2 or x.shape[-1] != weight.shape[1]:
        raise ValueError(f"x [..., {x.shape[-1]}] does not match weight {tuple(weight.shape)} ([N, K] expected)")
    if bias is not None and (bias.dim() != 1 or bias.shape[0] != weight.shape[0]):
        raise ValueError(f"bias {tuple(bias.shape)} does not match weight {tuple(weight.shape)}")
    if x.device != weight.device or (bias is not None and bias.device != x.device):
        raise ValueError("x, weight and bias must be on one device")


def matmul_launch(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, out: torch.Tensor) -> KernelLaunch:
    """The launch of ``batch_invariant_linear`` for a 2-D ``x`` into ``out`` [M, N], not run."""
    check_launchable(_batch_invariant_matmul_kernel, x)
    (m, k), n = x.shape, weight.shape[0]
    config = tile_config(x.dtype)
    tiles = triton.cdiv(m, config["BLOCK_M"]) * triton.cdiv(n, config["BLOCK_N"])
    programs = max(1, min(tiles, num_compute_units(x.device)))
    options = {key: config.pop(key) for key in ("num_warps", "num_stages")}
    return KernelLaunch(
        _batch_invariant_matmul_kernel,
        (programs,),
        (
            x, weight, out if bias is None else bias, out,
            m, n, k, programs,
            *x.stride(), *weight.stride(), *out.stride(),
        ),
        {**config, "HAS_BIAS": bias is not None,
         "DOT_IN_FP32": x.dtype == torch.float32 or x.device.type == "cpu", **options},
    )


def batch_invariant_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` with each output row's bits independent of the other rows
    (fp32 accumulation, one K order, bias added once, one rounding)."""
    check_matmul(x, weight, bias)
    lead = x.shape[:-1]
    x2 = x.reshape(-1, x.shape[-1])
    out = torch.empty((x2.shape[0], weight.shape[0]), dtype=x.dtype, device=x.device)
    if x2.shape[0]:
        matmul_launch(x2, weight, bias, out).run()
    return out.view(*lead, weight.shape[0])


def reference_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """Plain torch: the same product in fp32 (float64 sums where x is fp32), one rounding."""
    wide = torch.float64 if x.dtype == torch.float32 else torch.float32
    y = x.to(wide) @ weight.to(wide).t()
    if bias is not None:
        y = y + bias.to(wide)
    return y.to(x.dtype)
