"""Argument checks shared by the torch references and the Triton kernels.

Both implementations take the same arguments, so they reject bad input with
the same messages; a caller can swap one for the other without surprises.
"""
from __future__ import annotations

import torch

SUPPORTED_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def check_cache_pair(key_cache: torch.Tensor, value_cache: torch.Tensor) -> None:
    if key_cache.dim() != 4:
        raise ValueError(
            f"key_cache must be [num_blocks, block_size, num_kv_heads, head_dim], got shape {tuple(key_cache.shape)}"
        )
    if value_cache.shape != key_cache.shape:
        raise ValueError(f"value_cache shape {tuple(value_cache.shape)} != key_cache shape {tuple(key_cache.shape)}")
    if value_cache.dtype != key_cache.dtype:
        raise ValueError(f"value_cache dtype {value_cache.dtype} != key_cache dtype {key_cache.dtype}")
    if key_cache.dtype not in SUPPORTED_DTYPES:
        raise ValueError(f"cache dtype {key_cache.dtype} not supported; use one of {SUPPORTED_DTYPES}")


def check_reshape_and_cache(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    check_cache_pair(key_cache, value_cache)
    _, _, num_kv_heads, head_dim = key_cache.shape
    if key.dim() != 3 or key.shape[1:] != (num_kv_heads, head_dim):
        raise ValueError(
            f"key must be [T, {num_kv_heads}, {head_dim}] to match the cache, got shape {tuple(key.shape)}"
        )
    if value.shape != key.shape:
        raise ValueError(f"value shape {tuple(value.shape)} != key shape {tuple(key.shape)}")
    if slot_mapping.dim() != 1 or slot_mapping.shape[0] != key.shape[0]:
        raise ValueError(f"slot_mapping must be [T={key.shape[0]}], got shape {tuple(slot_mapping.shape)}")
    if slot_mapping.dtype not in (torch.int64, torch.int32):
        raise ValueError(f"slot_mapping must be an integer tensor (int64), got {slot_mapping.dtype}")
    for name, t in (("key", key), ("value", value), ("slot_mapping", slot_mapping), ("value_cache", value_cache)):
        if t.device != key_cache.device:
            raise ValueError(f"{name} is on {t.device} but key_cache is on {key_cache.device}")


def check_unified_attention(
    q: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    out: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    block_tables: torch.Tensor,
    num_kv_splits: int | None,
) -> None:
    check_cache_pair(key_cache, value_cache)
    _, _, num_kv_heads, head_dim = key_cache.shape
    if q.dim() != 3 or q.shape[2] != head_dim:
        raise ValueError(f"q must be [T, num_heads, {head_dim}], got shape {tuple(q.shape)}")
    if q.dtype not in SUPPORTED_DTYPES:
        raise ValueError(f"q dtype {q.dtype} not supported; use one of {SUPPORTED_DTYPES}")
    if q.shape[1] % num_kv_heads != 0:
        raise ValueError(f"num query heads {q.shape[1]} is not a multiple of num kv heads {num_kv_heads}")
    if out.shape != q.shape:
        raise ValueError(f"out shape {tuple(out.shape)} != q shape {tuple(q.shape)}")
    num_seqs = seq_lens.shape[0] if seq_lens.dim() == 1 else -1
    if seq_lens.dim() != 1:
        raise ValueError(f"seq_lens must be [B], got shape {tuple(seq_lens.shape)}")
    if query_start_loc.dim() != 1 or query_start_loc.shape[0] != num_seqs + 1:
        raise ValueError(f"query_start_loc must be [B+1={num_seqs + 1}], got shape {tuple(query_start_loc.shape)}")
    if block_tables.dim() != 2 or block_tables.shape[0] != num_seqs:
        raise ValueError(f"block_tables must be [B={num_seqs}, max_blocks], got shape {tuple(block_tables.shape)}")
    for name, t in (("query_start_loc", query_start_loc), ("seq_lens", seq_lens), ("block_tables", block_tables)):
        if t.dtype not in (torch.int32, torch.int64):
            raise ValueError(f"{name} must be an integer tensor (int32), got {t.dtype}")
    for name, t in (
        ("q", q), ("out", out), ("value_cache", value_cache), ("query_start_loc", query_start_loc),
        ("seq_lens", seq_lens), ("block_tables", block_tables),
    ):
        if t.device != key_cache.device:
            raise ValueError(f"{name} is on {t.device} but key_cache is on {key_cache.device}")
    if num_kv_splits is not None and (not isinstance(num_kv_splits, int) or num_kv_splits < 1):
        raise ValueError(f"num_kv_splits must be None or an int >= 1, got {num_kv_splits!r}")
