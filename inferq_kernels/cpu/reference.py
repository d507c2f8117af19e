"""Plain-torch references of the C kernels in inferq_kernels/cpu, one per kernel, at the tensor level
(the C functions take the same tensors as pointers, strides and sizes; gpuworker/attention/
cpu_kernels.py and gpuworker/models/cpu_linear.py do that translation). The tests compare the
kernels to these; where a kernel's roundings differ (its own exp, its order of fp32 sums) the
docstring says so.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """linear_avx512.c / linear_avx2.c (``*_linear`` over a ``*_pack``ed weight): ``x @ weight.T
    + bias``. bf16: fp32 accumulation, one rounding (as oneDNN). fp32: K summed in blocks of 64."""
    return F.linear(x, weight, bias)


def paged_decode(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_table: torch.Tensor,
                 seq_len: int, scale: float) -> torch.Tensor:
    """paged_decode.c ``paged_decode_{f32,bf16}`` for one sequence's query row ``q`` [Hq, D]
    against its ``seq_len`` cached tokens (cache [blocks, block_size, Hkv, D], ``block_table``
    the block ids): softmax(scale * q.k) . v per query head, GQA by Hq // Hkv, fp32 inside."""
    bs = k_cache.shape[1]
    nblocks = -(-seq_len // bs)
    k = k_cache[block_table[:nblocks].long()].flatten(0, 1)[:seq_len].float()  # [S, Hkv, D]
    v = v_cache[block_table[:nblocks].long()].flatten(0, 1)[:seq_len].float()
    g = q.shape[0] // k.shape[1]
    k, v = k.repeat_interleave(g, dim=1), v.repeat_interleave(g, dim=1)
    scores = torch.einsum("hd,shd->hs", q.float(), k) * scale
    return torch.einsum("hs,shd->hd", scores.softmax(-1), v).to(q.dtype)


def paged_prefill(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_table: torch.Tensor,
                  context: int, scale: float) -> torch.Tensor:
    """paged_prefill.c ``paged_prefill_{f32,bf16}`` for one chunk: query rows ``q`` [Q, Hq, D] at
    positions ``context .. context + Q - 1`` against the sequence's ``context + Q`` cached tokens
    (the chunk's own k/v already written), causal: row i sees keys 0 .. context + i. fp32 inside;
    the kernel's online softmax adds in another order and uses its own exp (within fp32 rounding)."""
    n_q = q.shape[0]
    seq_len = context + n_q
    bs = k_cache.shape[1]
    nblocks = -(-seq_len // bs)
    k = k_cache[block_table[:nblocks].long()].flatten(0, 1)[:seq_len].float()  # [S, Hkv, D]
    v = v_cache[block_table[:nblocks].long()].flatten(0, 1)[:seq_len].float()
    g = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(g, dim=1), v.repeat_interleave(g, dim=1)
    scores = torch.einsum("qhd,shd->hqs", q.float(), k) * scale
    allowed = torch.arange(seq_len)[None, :] <= torch.arange(context, seq_len)[:, None]  # [Q, S]
    scores = scores.masked_fill(~allowed, float("-inf"))
    return torch.einsum("hqs,shd->qhd", scores.softmax(-1), v).to(q.dtype)


def rotary(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """paged_decode.c ``rotary_{f32,bf16}``: ``swap_halves(x) * sin + x * cos`` for q [T, Hq, D]
    and k [T, Hk, D], cos/sin [T, 1, D] (sign folded into sin); bit-identical (no sums)."""
    def rot(x):
        x1, x2 = x.chunk(2, dim=-1)
        return torch.cat((x2, x1), dim=-1).mul_(sin).add_(x * cos)
    return rot(q), rot(k)


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """paged_decode.c ``silu_mul_{f32,bf16}``: ``F.silu(gate) * up`` of fused [T, 2I] rows
    (the kernel's exp differs from torch's in the last bits: within an ulp or two)."""
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate).mul_(up)


def add_rms_norm(residual: torch.Tensor, hidden: torch.Tensor | None, weight: torch.Tensor,
                 eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """paged_decode.c ``add_rms_norm_{f32,bf16}``: ``residual += hidden`` in place, then
    RMSNorm of it (fp32 statistics, weight in the model dtype); returns (normed, residual)."""
    if hidden is not None:
        residual.add_(hidden)
    x = residual.float()
    normed = (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)).to(residual.dtype)
    return weight * normed, residual
