"""Split-K (flash-decoding) for decode batches that are too small to fill the GPU.

A decode-only step launches one program per (sequence, KV head). With a few
sequences and long contexts that is a handful of programs on 132 SMs, each
streaming the whole context alone. Split-K cuts every sequence's keys into
``num_kv_splits`` contiguous segments handled by separate programs (the third
grid axis of the unified kernel); each writes its segment's normalised output
``o_s`` and log-sum-exp ``lse_s`` (base 2). This module's kernel merges them:

    out = sum_s 2^(lse_s - max lse) * o_s / sum_s 2^(lse_s - max lse)

An empty segment has lse = -inf and weight 0.

Batch-invariant mode cuts the keys at fixed positions instead (``KV_SPLIT_TOKENS``
keys a segment, whatever the batch: ``invariant_num_kv_splits`` only sizes the grid)
and merges a row's segments one after another in segment order (``IN_ORDER``), so the
empty segments past a row's keys add exact zeros and the sum is the same for any count.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from inferq.kernels.runtime import KernelLaunch

MIN_KEYS_PER_SPLIT = 128  # below this a segment costs more in launch/merge than it saves
MAX_SPLITS = 64
# Batch-invariant mode: keys per segment, the same for every row of every step. Long
# enough that short contexts stay one segment (no merge), short enough that a single
# long decode still spreads over a few programs per KV head.
KV_SPLIT_TOKENS = 512


def invariant_num_kv_splits(max_seq_len: int, kv_split_tokens: int = KV_SPLIT_TOKENS) -> int:
    """Grid segments for batch-invariant mode: enough fixed-size segments for the longest
    sequence, rounded up to a power of two so few variants compile (the extra ones are empty)."""
    return triton.next_power_of_2(max(1, triton.cdiv(max_seq_len, kv_split_tokens)))


def choose_num_kv_splits(
    num_seqs: int, num_kv_heads: int, max_query_len: int, max_seq_len: int, num_compute_units: int
) -> int:
    """1 (no split) unless the step is decode-only and its grid would leave the GPU idle.

    Returns a power of two so the kernel compiles for few distinct values.
    """
    if max_query_len != 1:
        return 1
    programs = num_seqs * num_kv_heads
    if programs >= num_compute_units:
        return 1
    by_length = max_seq_len // MIN_KEYS_PER_SPLIT
    by_occupancy = triton.cdiv(2 * num_compute_units, programs)  # aim for about two waves
    wanted = min(by_length, by_occupancy, MAX_SPLITS)
    if wanted < 2:
        return 1
    return 1 << (wanted.bit_length() - 1)  # round down to a power of two


def possible_num_kv_splits(num_kv_heads: int, max_seq_len: int, num_compute_units: int) -> list[int]:
    """Every count ``choose_num_kv_splits`` can return for sequences up to ``max_seq_len``.

    One sequence at the longest length gets the most; every smaller power of two
    comes with a shorter one.
    """
    most = choose_num_kv_splits(1, num_kv_heads, 1, max_seq_len, num_compute_units)
    return [1 << i for i in range(most.bit_length())]


# The batch size changes every step and the query offsets are a slice of the step's
# buffer (alignment flips with it): neither may key a compile (1-3 s each).
@triton.jit(do_not_specialize=("num_seqs",), do_not_specialize_on_alignment=("query_start_loc_ptr",))
def _merge_kv_splits_kernel(
    part_out_ptr, part_lse_ptr, out_ptr, query_start_loc_ptr,
    num_seqs, num_heads,
    stride_ot, stride_oh, stride_od,
    NUM_SPLITS: tl.constexpr,
    SPLITS_PAD: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    DIM_PAD: tl.constexpr,
    IN_ORDER: tl.constexpr,  # batch-invariant mode: fold the segments one by one, in order
):
    token = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    if token >= tl.load(query_start_loc_ptr + num_seqs):
        return  # padding row past the last sequence: never computed, left untouched
    splits = tl.arange(0, SPLITS_PAD)
    split_ok = splits < NUM_SPLITS
    dims = tl.arange(0, DIM_PAD)
    row = (token * num_heads + head) * NUM_SPLITS
    lse = tl.load(part_lse_ptr + row + splits, mask=split_ok, other=float("-inf"))
    top = tl.max(lse, axis=0)  # a max is exact in any order; segment 0 holds the first key, so it is finite
    if IN_ORDER:
        # A tree sum's shape follows SPLITS_PAD (the grid's count, from the batch's longest
        # sequence); in order, the empty trailing segments add exact zeros.
        num = tl.zeros([DIM_PAD], tl.float32)
        den = 0.0
        for s in range(NUM_SPLITS):
            w = tl.exp2(tl.load(part_lse_ptr + row + s) - top)
            num += w * tl.load(part_out_ptr + (row + s) * DIM_PAD + dims)
            den += w
        merged = num / den
    else:
        weight = tl.exp2(lse - top)
        weight = tl.where(split_ok, weight, 0.0)
        o = tl.load(part_out_ptr + (row + splits)[:, None] * DIM_PAD + dims[None, :], mask=split_ok[:, None], other=0.0)
        merged = tl.sum(weight[:, None] * o, axis=0) / tl.sum(weight, axis=0)
    tl.store(
        out_ptr + token * stride_ot + head * stride_oh + dims * stride_od,
        merged.to(out_ptr.dtype.element_ty),
        mask=dims < HEAD_DIM,
    )


MERGE_LAUNCH_OPTIONS = dict(num_warps=4)


def merge_constants(num_splits: int, head_dim: int, dim_pad: int, in_order: bool = False) -> dict:
    return dict(
        NUM_SPLITS=num_splits,
        SPLITS_PAD=triton.next_power_of_2(num_splits),
        HEAD_DIM=head_dim,
        DIM_PAD=dim_pad,
        IN_ORDER=in_order,
    )


def merge_kv_splits_launch(
    part_out: torch.Tensor,  # [T, Hq, S, DIM_PAD] fp32
    part_lse: torch.Tensor,  # [T, Hq, S] fp32
    out: torch.Tensor,  # [T, Hq, D]
    query_start_loc: torch.Tensor,  # [B+1]
    num_seqs: int,
    in_order: bool = False,
) -> KernelLaunch:
    num_tokens, num_heads, num_splits, dim_pad = part_out.shape
    return KernelLaunch(
        _merge_kv_splits_kernel,
        (num_tokens, num_heads),
        (part_out, part_lse, out, query_start_loc, num_seqs, num_heads, *out.stride()),
        {**merge_constants(num_splits, out.shape[2], dim_pad, in_order), **MERGE_LAUNCH_OPTIONS},
    )


def merge_kv_splits(
    part_out: torch.Tensor,  # [T, Hq, S, DIM_PAD] fp32
    part_lse: torch.Tensor,  # [T, Hq, S] fp32
    out: torch.Tensor,  # [T, Hq, D]
    query_start_loc: torch.Tensor,  # [B+1]
    num_seqs: int,
    in_order: bool = False,
) -> None:
    merge_kv_splits_launch(part_out, part_lse, out, query_start_loc, num_seqs, in_order).run()
