"""Plain-torch references for the Triton kernels, with identical signatures.

They are written for clarity, not speed: one sequence at a time, fp32 math.
The tests hold every Triton kernel to these, and these to a naive per-token
softmax written in the tests themselves.
"""
from __future__ import annotations

import torch

from inferq.kernels.checks import check_reshape_and_cache, check_unified_attention


def reshape_and_cache(
    key: torch.Tensor,  # [T, Hkv, D]
    value: torch.Tensor,  # [T, Hkv, D]
    key_cache: torch.Tensor,  # [num_blocks, block_size, Hkv, D]
    value_cache: torch.Tensor,  # [num_blocks, block_size, Hkv, D]
    slot_mapping: torch.Tensor,  # [T] int64, slot = block * block_size + offset; < 0 skips the token
) -> None:
    """Write each token's K and V into its cache slot, in place."""
    check_reshape_and_cache(key, value, key_cache, value_cache, slot_mapping)
    block_size = key_cache.shape[1]
    keep = slot_mapping >= 0
    slots = slot_mapping[keep].long()
    blocks, offsets = slots // block_size, slots % block_size
    key_cache[blocks, offsets] = key[keep].to(key_cache.dtype)
    value_cache[blocks, offsets] = value[keep].to(value_cache.dtype)


def gather_sequence_kv(
    cache: torch.Tensor, block_table: torch.Tensor, seq_len: int
) -> torch.Tensor:
    """The first ``seq_len`` cached tokens of one sequence, in order: [seq_len, Hkv, D]."""
    block_size = cache.shape[1]
    num_blocks = (seq_len + block_size - 1) // block_size
    blocks = cache[block_table[:num_blocks].long()]  # [n, bs, Hkv, D]
    return blocks.reshape(-1, *cache.shape[2:])[:seq_len]


def unified_attention(
    q: torch.Tensor,  # [T, Hq, D]
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    out: torch.Tensor,  # [T, Hq, D], written in place and returned
    query_start_loc: torch.Tensor,  # [B+1] int32
    seq_lens: torch.Tensor,  # [B] int32, context + new tokens
    block_tables: torch.Tensor,  # [B, max_blocks] int32
    max_query_len: int,
    max_seq_len: int,
    softmax_scale: float,
    num_kv_splits: int | None = None,  # accepted for signature parity; a split does not change the math
) -> torch.Tensor:
    """Causal attention of each sequence's new tokens over its whole cached sequence.

    Sequence ``i``'s query rows are ``query_start_loc[i]:query_start_loc[i+1]``;
    they are its last tokens, so row ``j`` sits at position
    ``seq_len - query_len + j`` and sees keys at positions ``<=`` that.
    The K/V of those tokens must already be in the cache.
    """
    check_unified_attention(q, key_cache, value_cache, out, query_start_loc, seq_lens, block_tables, num_kv_splits)
    num_heads, num_kv_heads = q.shape[1], key_cache.shape[2]
    group = num_heads // num_kv_heads
    starts = query_start_loc.tolist()
    lens = seq_lens.tolist()
    for i, seq_len in enumerate(lens):
        q_lo, q_hi = starts[i], starts[i + 1]
        query_len = q_hi - q_lo
        if query_len == 0:
            continue
        if query_len > seq_len:
            raise ValueError(f"sequence {i}: {query_len} query tokens but seq_len is only {seq_len}")
        context_len = seq_len - query_len
        k = gather_sequence_kv(key_cache, block_tables[i], seq_len).float()  # [S, Hkv, D]
        v = gather_sequence_kv(value_cache, block_tables[i], seq_len).float()
        k = k.repeat_interleave(group, dim=1)  # [S, Hq, D]: query head h reads kv head h // group
        v = v.repeat_interleave(group, dim=1)
        qi = q[q_lo:q_hi].float()  # [L, Hq, D]
        scores = torch.einsum("lhd,shd->hls", qi, k) * softmax_scale
        query_pos = context_len + torch.arange(query_len, device=q.device)
        key_pos = torch.arange(seq_len, device=q.device)
        visible = key_pos[None, :] <= query_pos[:, None]  # [L, S]
        scores = scores.masked_fill(~visible, float("-inf"))
        probs = torch.softmax(scores, dim=-1)
        out[q_lo:q_hi] = torch.einsum("hls,shd->lhd", probs, v).to(out.dtype)
    return out
