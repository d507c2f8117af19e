"""Triton kernel: paged causal attention for any mix of prefill chunks and decodes.

Grid ``(q_blocks, num_kv_heads, num_kv_splits)``. A program owns one KV head
and a tile of ``BLOCK_M`` query rows = ``BLOCK_Q`` consecutive query tokens of
one sequence x the ``Hq/Hkv`` query heads that share that KV head (GQA packing:
K/V are loaded once for the whole group). Sequence i's q-block slots start at
``query_start_loc[i] // BLOCK_Q + i``, which leaves it at least
``ceil(query_len / BLOCK_Q)`` of them, so the grid ``T // BLOCK_Q + B`` is known
without reading lengths on the host; a program finds its sequence by a binary
search over ``query_start_loc`` and exits if its slot is past the end.

A program walks the KV tiles (``BLOCK_N`` keys, resolved key by key through
the block table, so any block size works) up to the last key its last query
row can see; tiles past the causal limit are never loaded. Softmax is online,
in fp32 and base 2. With ``num_kv_splits > 1`` (split-K, see
``inferq_kernels/split_k_decode.py``) each program covers one contiguous segment of
those tiles and writes a normalised partial output plus its log-sum-exp; a
second kernel merges the segments.

Batch-invariant mode (``kv_split_tokens`` given): one tile shape for every step
and segments of a fixed number of keys (``[s * kv_split_tokens, (s+1) *
kv_split_tokens)``), merged in segment order, so a row's arithmetic depends on
its position alone, not on the batch, its chunk, or the graph it runs in
(docs/kernels.md, "Batch invariance (GPU)").

On CPU this only runs under ``TRITON_INTERPRET=1``, set before this module is
imported.
"""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from inferq.kernels.checks import check_unified_attention
from inferq.kernels.runtime import KernelLaunch, check_launchable, num_compute_units
from inferq.kernels.split_k_decode import (
    choose_num_kv_splits,
    invariant_num_kv_splits,
    merge_kv_splits_launch,
    possible_num_kv_splits,
)

# Triton compiles one kernel per distinct specialisation of its arguments (ints equal
# to 1 or divisible by 16, pointers 16-byte aligned): 1-3 s each, inside a step. These
# change from step to step, so none of them may key a compile:
# the batch size and the block table's width (its row stride) ...
STEP_VARYING_INTS = ("num_seqs", "stride_block_table")
# ... and the metadata tensors, which the model runner slices out of one step buffer,
# so their alignment flips with the batch size. They are read by scalar loads and
# gathers, which an alignment hint does not speed up.
METADATA_POINTERS = ("query_start_loc_ptr", "seq_lens_ptr", "block_tables_ptr")

# Up to this many query rows per sequence a step uses 16-row tiles (decodes), above it 64.
DECODE_TILE_MAX_QUERY_LEN = 4
# Batch-invariant mode: the most split-K scratch one launch may use; a step needing more runs
# in pieces of rows.
MAX_PARTIAL_BYTES = 256 * 1024**2


@triton.jit
def _find_sequence(query_start_loc_ptr, num_seqs, q_block, BLOCK_Q: tl.constexpr):
    """The last sequence i whose first q-block slot (start_i // BLOCK_Q + i) is <= q_block."""
    lo: tl.int32 = 0
    hi = num_seqs
    while lo < hi:
        mid = (lo + hi) // 2
        first_slot = tl.load(query_start_loc_ptr + mid) // BLOCK_Q + mid
        if first_slot <= q_block:
            lo = mid + 1
        else:
            hi = mid
    return lo - 1


@triton.jit
def _dot(a, b, IN_FP32: tl.constexpr):
    # fp32 inputs: exact fp32 (no TF32). IN_FP32 is also set on the CPU
    # interpreter for fp16/bf16, because numpy has no bf16 matmul (the
    # interpreter's bf16 tl.dot returns garbage); operands were already rounded
    # to their storage dtype, so only the accumulation order differs from a GPU.
    if IN_FP32:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    else:
        return tl.dot(a, b)


@triton.jit(do_not_specialize=STEP_VARYING_INTS, do_not_specialize_on_alignment=METADATA_POINTERS)
def _unified_attention_kernel(
    q_ptr, key_cache_ptr, value_cache_ptr, out_ptr,
    part_out_ptr, part_lse_ptr,  # split-K scratch: [T, Hq, NUM_SPLITS, DIM_PAD], [T, Hq, NUM_SPLITS] fp32
    query_start_loc_ptr, seq_lens_ptr, block_tables_ptr,
    num_seqs, num_heads,
    scale_log2,  # softmax_scale * log2(e): the softmax runs in base 2
    stride_qt, stride_qh, stride_qd,
    stride_ot, stride_oh, stride_od,
    stride_cb, stride_cs, stride_ch, stride_cd,  # same for the key and the value cache
    stride_block_table,
    QUERIES_PER_KV: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    DIM_PAD: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_Q: tl.constexpr,
    BLOCK_N: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    SPLIT_TILES: tl.constexpr,  # 0: NUM_SPLITS even segments of the tile's keys; > 0: segments of this many KV tiles
    DOT_IN_FP32: tl.constexpr,
):
    q_block = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)

    seq = _find_sequence(query_start_loc_ptr, num_seqs, q_block, BLOCK_Q)
    q_begin = tl.load(query_start_loc_ptr + seq)
    query_len = tl.load(query_start_loc_ptr + seq + 1) - q_begin
    q_first = (q_block - (q_begin // BLOCK_Q + seq)) * BLOCK_Q  # first query row of this tile, within the sequence
    if q_first >= query_len:
        return
    seq_len = tl.load(seq_lens_ptr + seq)
    context_len = seq_len - query_len

    # Tile row r is query token q_first + r // QUERIES_PER_KV under query head
    # kv_head * QUERIES_PER_KV + r % QUERIES_PER_KV.
    rows = tl.arange(0, BLOCK_M)
    q_idx = q_first + rows // QUERIES_PER_KV
    head = kv_head * QUERIES_PER_KV + rows % QUERIES_PER_KV
    row_ok = (rows // QUERIES_PER_KV < BLOCK_Q) & (q_idx < query_len)
    dims = tl.arange(0, DIM_PAD)
    dim_ok = dims < HEAD_DIM
    token = (q_begin + q_idx).to(tl.int64)
    q = tl.load(
        q_ptr + token[:, None] * stride_qt + head[:, None] * stride_qh + dims[None, :] * stride_qd,
        mask=row_ok[:, None] & dim_ok[None, :],
        other=0.0,
    )
    query_pos = context_len + q_idx

    # Keys [0, kv_end) are visible to at least one row of this tile.
    kv_end = context_len + tl.minimum(q_first + BLOCK_Q, query_len)
    num_tiles = tl.cdiv(kv_end, BLOCK_N)
    if SPLIT_TILES == 0:
        tiles_per_split = tl.cdiv(num_tiles, NUM_SPLITS)
    else:
        # Fixed key ranges: a row's segments depend on its position only. A tile past a
        # row's last key (seen by a later row of the tile) leaves its m, l and acc exactly
        # as they were (p = 0, alpha = 1), so the row gets a decode row's bits.
        tiles_per_split = SPLIT_TILES
    tile_lo = split * tiles_per_split
    tile_hi = tl.minimum(tile_lo + tiles_per_split, num_tiles)

    m = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, DIM_PAD], tl.float32)
    block_row = block_tables_ptr + seq.to(tl.int64) * stride_block_table
    for tile in range(tile_lo, tile_hi):
        key_pos = tile * BLOCK_N + tl.arange(0, BLOCK_N)
        key_ok = key_pos < kv_end
        block = tl.load(block_row + key_pos // BLOCK_SIZE, mask=key_ok, other=0).to(tl.int64)
        kv_offset = block * stride_cb + (key_pos % BLOCK_SIZE) * stride_cs + kv_head * stride_ch
        k = tl.load(
            key_cache_ptr + kv_offset[None, :] + dims[:, None] * stride_cd,
            mask=key_ok[None, :] & dim_ok[:, None],
            other=0.0,
        )  # [DIM_PAD, BLOCK_N]
        v = tl.load(
            value_cache_ptr + kv_offset[:, None] + dims[None, :] * stride_cd,
            mask=key_ok[:, None] & dim_ok[None, :],
            other=0.0,
        )  # [BLOCK_N, DIM_PAD]
        s = _dot(q, k.to(q.dtype), DOT_IN_FP32) * scale_log2
        visible = (key_pos[None, :] <= query_pos[:, None]) & key_ok[None, :]
        s = tl.where(visible, s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, axis=1))
        # A row that has seen no visible key yet keeps m = -inf; shift by 0 so
        # exp2 gives 0 instead of NaN.
        m_shift = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.exp2(s - m_shift[:, None])
        alpha = tl.exp2(m - m_shift)
        l = l * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + _dot(p.to(v.dtype), v, DOT_IN_FP32)
        m = m_new

    # Every real row sees at least its own key, so l > 0 there; l == 0 only in
    # an empty split-K segment, whose weight in the merge is exp2(-inf) = 0.
    l_safe = tl.where(l == 0.0, 1.0, l)
    o = acc / l_safe[:, None]
    if NUM_SPLITS == 1:
        tl.store(
            out_ptr + token[:, None] * stride_ot + head[:, None] * stride_oh + dims[None, :] * stride_od,
            o.to(out_ptr.dtype.element_ty),
            mask=row_ok[:, None] & dim_ok[None, :],
        )
    else:
        part_row = (token * num_heads + head) * NUM_SPLITS + split
        lse = tl.where(l == 0.0, float("-inf"), m + tl.log2(l_safe))
        tl.store(part_lse_ptr + part_row, lse, mask=row_ok)
        tl.store(
            part_out_ptr + part_row[:, None] * DIM_PAD + dims[None, :],
            o,
            mask=row_ok[:, None],
        )


LAUNCH_OPTIONS = dict(num_warps=4, num_stages=2)


def kernel_constants(
    dtype: torch.dtype,
    device_type: str,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    block_size: int,
    max_query_len: int,
    num_kv_splits: int,
    kv_split_tokens: int | None = None,
) -> dict:
    """The constexpr arguments of one launch (also used to compile ahead of time for a GPU).
    ``kv_split_tokens``: batch-invariant mode, one tile shape whatever the step."""
    queries_per_kv = num_heads // num_kv_heads
    # decodes leave most rows of a big tile idle; tl.dot needs >= 16. Batch-invariant mode
    # keeps the decode tile for prompt chunks too: another tile shape may sum a dot in
    # another order (on Hopper, 64-row tiles can take wgmma where 16-row ones take mma).
    invariant = kv_split_tokens is not None
    rows = 16 if invariant or max_query_len <= DECODE_TILE_MAX_QUERY_LEN else 64
    block_m = max(rows, triton.next_power_of_2(queries_per_kv))
    dim_pad = max(16, triton.next_power_of_2(head_dim))
    block_n = 32 if (dtype == torch.float32 and dim_pad >= 128) else 64  # fp32 tiles cost twice the registers
    if invariant and (kv_split_tokens < block_n or kv_split_tokens % block_n):
        raise ValueError(f"kv_split_tokens must be a multiple of the KV tile ({block_n} keys), got {kv_split_tokens}")
    return dict(
        QUERIES_PER_KV=queries_per_kv,
        HEAD_DIM=head_dim,
        DIM_PAD=dim_pad,
        BLOCK_SIZE=block_size,
        BLOCK_M=block_m,
        BLOCK_Q=block_m // queries_per_kv,
        BLOCK_N=block_n,
        NUM_SPLITS=num_kv_splits,
        SPLIT_TILES=kv_split_tokens // block_n if invariant else 0,
        DOT_IN_FP32=dtype == torch.float32 or device_type == "cpu",
    )


def compile_variants(
    num_kv_heads: int, max_seq_len: int, max_query_len: int, num_compute_units: int, num_kv_splits: int | None = None,
    kv_split_tokens: int | None = None,
) -> list[tuple[int, int]]:
    """One ``(max_query_len, num_kv_splits)`` per constexpr set steps up to these limits can
    launch with (the other arguments no longer key compiles): decodes at each split-K count
    ``choose_num_kv_splits`` can pick (or the fixed one), and 64-row prefill tiles.
    Batch-invariant mode (``kv_split_tokens``): one tile for all, at each segment count
    ``invariant_num_kv_splits`` can give (or the fixed one)."""
    if kv_split_tokens is not None:
        if num_kv_splits is not None:
            return [(1, num_kv_splits)]
        most = invariant_num_kv_splits(max_seq_len, kv_split_tokens)
        return [(1, 1 << i) for i in range(most.bit_length())]
    if num_kv_splits is None:
        decode_splits = possible_num_kv_splits(num_kv_heads, max_seq_len, num_compute_units)
        prefill_splits = 1
    else:
        decode_splits, prefill_splits = [num_kv_splits], num_kv_splits
    variants = [(1, splits) for splits in decode_splits]
    if max_query_len > DECODE_TILE_MAX_QUERY_LEN:
        variants.append((DECODE_TILE_MAX_QUERY_LEN + 1, prefill_splits))
    return variants


def unified_attention_launches(
    q: torch.Tensor,  # [T, Hq, D]
    key_cache: torch.Tensor,  # [num_blocks, block_size, Hkv, D]
    value_cache: torch.Tensor,
    out: torch.Tensor,  # [T, Hq, D], written in place
    query_start_loc: torch.Tensor,  # [B+1] int32
    seq_lens: torch.Tensor,  # [B] int32, context + new tokens
    block_tables: torch.Tensor,  # [B, max_blocks] int32
    max_query_len: int,
    max_seq_len: int,
    softmax_scale: float,
    num_kv_splits: int | None = None,  # None: split-K chosen automatically for decode-only batches
    kv_split_tokens: int | None = None,  # batch-invariant mode: segments of this many keys
) -> list[KernelLaunch]:
    """The launches of ``unified_attention``, in order, not run (split-K scratch allocated).

    Batch-invariant mode (``kv_split_tokens``): ``num_kv_splits`` is only the grid's segment
    count, at least ``cdiv(max_seq_len, kv_split_tokens)`` (None: that, rounded up to a power
    of two); segments past a row's keys are empty and weigh exactly 0 in the merge."""
    check_unified_attention(q, key_cache, value_cache, out, query_start_loc, seq_lens, block_tables, num_kv_splits)
    check_launchable(_unified_attention_kernel, key_cache)
    if key_cache.stride() != value_cache.stride():
        raise ValueError("key_cache and value_cache must have the same strides")
    num_tokens, num_heads, head_dim = q.shape
    num_seqs = seq_lens.shape[0]
    if num_tokens == 0 or num_seqs == 0:
        return []
    _, block_size, num_kv_heads, _ = key_cache.shape
    if kv_split_tokens is not None:
        needed = triton.cdiv(max_seq_len, kv_split_tokens)
        if num_kv_splits is None:
            num_kv_splits = invariant_num_kv_splits(max_seq_len, kv_split_tokens)
        elif num_kv_splits < needed:
            raise ValueError(f"num_kv_splits={num_kv_splits} segments of {kv_split_tokens} keys cannot hold "
                             f"max_seq_len={max_seq_len}; batch-invariant mode needs at least {needed}")
    elif num_kv_splits is None:
        num_kv_splits = choose_num_kv_splits(
            num_seqs, num_kv_heads, max_query_len, max_seq_len, num_compute_units(q.device)
        )
    const = kernel_constants(
        q.dtype, q.device.type, num_heads, num_kv_heads, head_dim, block_size, max_query_len, num_kv_splits,
        kv_split_tokens,
    )

    in_order = kv_split_tokens is not None
    rows = num_tokens
    if num_kv_splits > 1 and in_order:
        # Batch-invariant steps split prompt chunks too, so the partials of a long step at a long
        # context would be large (2,048 rows x 32 heads x 16 segments x 128 x 4 B = 512 MiB): the
        # step runs in pieces of rows that share one buffer (a row's bits do not depend on its piece).
        rows = max(1, min(num_tokens, MAX_PARTIAL_BYTES // (num_heads * num_kv_splits * const["DIM_PAD"] * 4)))
    if num_kv_splits > 1:
        part_out = torch.empty((rows, num_heads, num_kv_splits, const["DIM_PAD"]), dtype=torch.float32, device=q.device)
        part_lse = torch.empty((rows, num_heads, num_kv_splits), dtype=torch.float32, device=q.device)
    else:  # never read or written
        part_out = part_lse = out

    launches = []
    for lo in range(0, num_tokens, rows):
        hi = min(lo + rows, num_tokens)
        piece_qsl, piece_seq_lens = query_start_loc, seq_lens
        if rows < num_tokens:
            # The piece's rows of sequence i are the last tokens of a sequence that ends at its last
            # row in the piece; sequences with no row in it get length-0 queries (their programs exit).
            # Device ops on host constants: no sync, graph-capturable.
            ends = query_start_loc[1:]
            piece_qsl = (query_start_loc.clamp(lo, hi) - lo).to(query_start_loc.dtype)
            piece_seq_lens = (seq_lens - (ends - ends.clamp(max=hi))).to(seq_lens.dtype)
        piece_q, piece_out = q[lo:hi], out[lo:hi]
        launches.append(KernelLaunch(
            _unified_attention_kernel,
            ((hi - lo) // const["BLOCK_Q"] + num_seqs, num_kv_heads, num_kv_splits),
            (
                piece_q, key_cache, value_cache, piece_out,
                part_out, part_lse,
                piece_qsl, piece_seq_lens, block_tables,
                num_seqs, num_heads,
                softmax_scale * math.log2(math.e),
                *piece_q.stride(), *piece_out.stride(), *key_cache.stride(),
                block_tables.stride(0),
            ),
            {**const, **LAUNCH_OPTIONS},
        ))
        if num_kv_splits > 1:
            launches.append(merge_kv_splits_launch(
                part_out[: hi - lo], part_lse[: hi - lo], piece_out, piece_qsl, num_seqs, in_order))
    return launches


def unified_attention(
    q: torch.Tensor,  # [T, Hq, D]
    key_cache: torch.Tensor,  # [num_blocks, block_size, Hkv, D]
    value_cache: torch.Tensor,
    out: torch.Tensor,  # [T, Hq, D], written in place and returned
    query_start_loc: torch.Tensor,  # [B+1] int32
    seq_lens: torch.Tensor,  # [B] int32, context + new tokens
    block_tables: torch.Tensor,  # [B, max_blocks] int32
    max_query_len: int,
    max_seq_len: int,
    softmax_scale: float,
    num_kv_splits: int | None = None,  # None: split-K chosen automatically for decode-only batches
    kv_split_tokens: int | None = None,  # batch-invariant mode: segments of this many keys
) -> torch.Tensor:
    """Causal attention of each sequence's new tokens over its whole cached sequence.

    Same contract as ``inferq.kernels.reference.unified_attention``: sequence ``i``'s
    rows ``query_start_loc[i]:query_start_loc[i+1]`` are its last tokens and
    their K/V are already in the cache. Rows past ``query_start_loc[B]`` are
    left untouched. Nothing is read back to the host, so a call can be captured
    in a CUDA graph; programs find their sequence and split segment from the
    device tensors, so the split count fixed at capture stays correct.
    """
    for launch in unified_attention_launches(
        q, key_cache, value_cache, out, query_start_loc, seq_lens, block_tables,
        max_query_len, max_seq_len, softmax_scale, num_kv_splits, kv_split_tokens,
    ):
        launch.run()
    return out
