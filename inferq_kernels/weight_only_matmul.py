"""Triton kernel: a linear layer whose weights stay quantized in GPU memory.

``out[M, N] = x[M, K] @ dequant(weight)[N, K]^T (+ bias)``, with the weight stored as

* ``fp8``:  float8 e4m3 values and one fp32 scale per output channel (the FP8 checkpoints
  served on H100s: half the bytes of bf16);
* ``int8``: int8 values in [-127, 127] and one fp32 scale per output channel;
* ``int4``: two 4-bit values a byte along K (offset 8, so the byte holds q + 8), one fp32
  scale per output channel and group of ``group_size`` columns (a quarter of the bytes).

Decoding is bound by weight bytes, so the weight tile is widened to the activation dtype in
registers after its load and never exists dequantized in memory. The quantized values
convert exactly (|q| <= 448 with 3 mantissa bits, or an integer below 256, fits bf16), the
dot accumulates in fp32, and the scales multiply the fp32 partial sums: per channel once
at the end, per group after each group's dot.

Tile shape and K walk are constants of the dtype, as in ``batch_invariant_matmul``, so a
row's bits never depend on how many rows share the launch. On CPU this runs only under
``TRITON_INTERPRET=1`` (tests), with the dots in fp32.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from inferq.kernels.runtime import KernelLaunch, check_launchable

ACTIVATION_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
KINDS = ("fp8", "int8", "int4")
_KIND_CODE = {"fp8": 0, "int8": 1, "int4": 2}
FP8_MAX = 448.0  # the largest finite e4m3 value


@dataclass(frozen=True)
class QuantizedWeight:
    """A quantized ``[N, K]`` weight: ``values`` as stored, ``scales`` [N] or [N, K // group_size]."""

    kind: str
    values: torch.Tensor  # fp8 [N, K] | int8 [N, K] | uint8 [N, K // 2] (int4 pairs)
    scales: torch.Tensor  # fp32
    in_features: int
    group_size: int = 0  # int4 only

    @property
    def out_features(self) -> int:
        return self.values.shape[0]

    def to(self, device) -> "QuantizedWeight":
        return QuantizedWeight(self.kind, self.values.to(device), self.scales.to(device), self.in_features,
                               self.group_size)

    def nbytes(self) -> int:
        return self.values.numel() * self.values.element_size() + self.scales.numel() * 4


def quantize_weight(weight: torch.Tensor, kind: str, group_size: int = 128) -> QuantizedWeight:
    """Round-to-nearest symmetric quantization of a ``[N, K]`` weight (absmax scales)."""
    if kind not in KINDS:
        raise ValueError(f"unknown weight quantization {kind!r}: expected one of {', '.join(KINDS)}")
    if weight.dim() != 2:
        raise ValueError(f"a linear weight is [N, K], got {tuple(weight.shape)}")
    w = weight.detach().to(torch.float32)
    n, k = w.shape
    if kind == "int4":
        if k % group_size or group_size % 16:
            raise ValueError(f"int4 needs K ({k}) a multiple of group_size ({group_size}), itself a multiple of 16")
        groups = w.view(n, k // group_size, group_size)
        scales = (groups.abs().amax(dim=2) / 7.0).clamp_min(torch.finfo(torch.float32).tiny)
        q = torch.round(groups / scales[:, :, None]).clamp_(-8, 7).to(torch.int16).view(n, k) + 8
        packed = (q[:, 0::2] | (q[:, 1::2] << 4)).to(torch.uint8)
        return QuantizedWeight(kind, packed.contiguous(), scales.contiguous(), k, group_size)
    top = FP8_MAX if kind == "fp8" else 127.0
    scales = (w.abs().amax(dim=1) / top).clamp_min(torch.finfo(torch.float32).tiny)
    scaled = w / scales[:, None]
    if kind == "fp8":
        values = scaled.clamp_(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    else:
        values = torch.round(scaled).clamp_(-127, 127).to(torch.int8)
    return QuantizedWeight(kind, values.contiguous(), scales.contiguous(), k)


def dequantize_weight(qw: QuantizedWeight) -> torch.Tensor:
    """The fp32 ``[N, K]`` weight a ``QuantizedWeight`` stands for (the reference's input)."""
    if qw.kind == "int4":
        low = (qw.values & 0xF).to(torch.int16) - 8
        high = (qw.values >> 4).to(torch.int16) - 8
        q = torch.stack((low, high), dim=2).view(qw.out_features, qw.in_features).to(torch.float32)
        return q * qw.scales.repeat_interleave(qw.group_size, dim=1)
    return qw.values.to(torch.float32) * qw.scales[:, None]


def reference_linear(x: torch.Tensor, qw: QuantizedWeight, bias: torch.Tensor | None = None) -> torch.Tensor:
    """Plain torch: dequantize, multiply in float64, add the bias, round once to x's dtype."""
    y = x.to(torch.float64) @ dequantize_weight(qw).to(torch.float64).t()
    if bias is not None:
        y = y + bias.to(torch.float64)
    return y.to(x.dtype)


@triton.jit
def _dot(a, b, IN_FP32: tl.constexpr):
    if IN_FP32:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    else:
        return tl.dot(a, b.to(a.dtype))


# M changes every step: it must not key a compile.
@triton.jit(do_not_specialize=("M",))
def _weight_only_matmul_kernel(
    x_ptr, w_ptr, scale_ptr, bias_ptr, out_ptr,
    M, N, K,
    stride_xm, stride_xk,
    stride_wn, stride_wk,
    stride_sn, stride_sg,
    stride_om, stride_on,
    KIND: tl.constexpr,  # 0 fp8, 1 int8, 2 int4
    GROUP: tl.constexpr,  # int4: columns per scale (a multiple of BLOCK_K)
    HAS_BIAS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    DOT_IN_FP32: tl.constexpr,
):
    rm = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    m_ok = rm < M
    n_ok = rn < N
    x_rows = x_ptr + rm.to(tl.int64)[:, None] * stride_xm
    w_cols = w_ptr + rn.to(tl.int64)[None, :] * stride_wn
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for step in range(0, tl.cdiv(K, BLOCK_K)):  # in order: the one K walk of every row
        k = step * BLOCK_K + rk
        k_ok = k < K
        x = tl.load(x_rows + k[None, :] * stride_xk, mask=m_ok[:, None] & k_ok[None, :], other=0.0)
        w_mask = k_ok[:, None] & n_ok[None, :]
        if KIND == 2:
            packed = tl.load(w_cols + (k // 2)[:, None] * stride_wk, mask=w_mask, other=0)
            nibble = (packed.to(tl.int32) >> ((k % 2) * 4)[:, None]) & 0xF
            w = (nibble - 8).to(tl.float32)
            scale = tl.load(scale_ptr + rn * stride_sn + ((step * BLOCK_K) // GROUP) * stride_sg,
                            mask=n_ok, other=0.0)
            acc += _dot(x, w, DOT_IN_FP32) * scale[None, :]
        else:
            # no ``other``: a constant does not cast to fp8; masked lanes are zeroed after widening
            w = tl.where(w_mask, tl.load(w_cols + k[:, None] * stride_wk, mask=w_mask).to(tl.float32), 0.0)
            acc += _dot(x, w, DOT_IN_FP32)
    if KIND != 2:
        acc *= tl.load(scale_ptr + rn * stride_sn, mask=n_ok, other=0.0)[None, :]
    if HAS_BIAS:
        acc += tl.load(bias_ptr + rn, mask=n_ok, other=0.0).to(tl.float32)[None, :]
    tl.store(out_ptr + rm.to(tl.int64)[:, None] * stride_om + rn[None, :] * stride_on,
             acc.to(out_ptr.dtype.element_ty), mask=m_ok[:, None] & n_ok[None, :])


def tile_config(dtype: torch.dtype, kind: str) -> dict:
    """Constants of (dtype, kind), never of M. Decode rows are few: 16-row tiles (the
    smallest a tensor-core dot takes) waste little; int4's K tile fits inside one group."""
    block_k = 32 if kind == "int4" else 64
    if dtype == torch.float32:
        return dict(BLOCK_M=16, BLOCK_N=64, BLOCK_K=32, num_warps=4, num_stages=2)
    return dict(BLOCK_M=16, BLOCK_N=64, BLOCK_K=block_k, num_warps=4, num_stages=3)


def check_linear(x: torch.Tensor, qw: QuantizedWeight, bias: torch.Tensor | None) -> None:
    if x.dtype not in ACTIVATION_DTYPES:
        raise ValueError(f"weight-only matmul takes fp32/fp16/bf16 activations, got {x.dtype}")
    if qw.kind not in KINDS:
        raise ValueError(f"unknown weight quantization {qw.kind!r}")
    if x.shape[-1] != qw.in_features:
        raise ValueError(f"x [..., {x.shape[-1]}] does not match a weight of {qw.in_features} input features")
    if qw.kind == "int4" and qw.group_size % tile_config(x.dtype, "int4")["BLOCK_K"]:
        raise ValueError(f"int4 group_size {qw.group_size} must be a multiple of "
                         f"{tile_config(x.dtype, 'int4')['BLOCK_K']}")
    if bias is not None and tuple(bias.shape) != (qw.out_features,):
        raise ValueError(f"bias {tuple(bias.shape)} does not match {qw.out_features} output features")
    if qw.values.device != x.device or (bias is not None and bias.device != x.device):
        raise ValueError("x, the quantized weight and bias must be on one device")


def linear_launch(x: torch.Tensor, qw: QuantizedWeight, bias: torch.Tensor | None, out: torch.Tensor) -> KernelLaunch:
    """The launch of ``weight_only_linear`` for a 2-D ``x`` into ``out`` [M, N], not run."""
    check_launchable(_weight_only_matmul_kernel, x)
    m, n = x.shape[0], qw.out_features
    config = tile_config(x.dtype, qw.kind)
    options = {key: config.pop(key) for key in ("num_warps", "num_stages")}
    scales = qw.scales if qw.scales.dim() == 2 else qw.scales[:, None]
    return KernelLaunch(
        _weight_only_matmul_kernel,
        (triton.cdiv(m, config["BLOCK_M"]), triton.cdiv(n, config["BLOCK_N"])),
        (x, qw.values, scales, out if bias is None else bias, out,
         m, n, qw.in_features,
         *x.stride(), *qw.values.stride(), *scales.stride(), *out.stride()),
        {**config, "KIND": _KIND_CODE[qw.kind], "GROUP": max(qw.group_size, 1), "HAS_BIAS": bias is not None,
         "DOT_IN_FP32": x.dtype == torch.float32 or x.device.type == "cpu", **options},
    )


def weight_only_linear(x: torch.Tensor, qw: QuantizedWeight, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear(x, dequantize_weight(qw), bias)`` without a dequantized copy of the weight."""
    check_linear(x, qw, bias)
    lead = x.shape[:-1]
    x2 = x.reshape(-1, x.shape[-1])
    out = torch.empty((x2.shape[0], qw.out_features), dtype=x.dtype, device=x.device)
    if x2.shape[0]:
        linear_launch(x2, qw, bias, out).run()
    return out.view(*lead, qw.out_features)
