"""Paged-cache arithmetic the kernel and model tests share: where a token of a
sequence lives in the cache, and its block tables as one padded tensor (as the
model runner lays them out)."""
from __future__ import annotations

import torch


def slots(table, positions, block_size: int):
    """Cache slots of ``positions`` for a sequence with block ``table``
    (slot = block id * block_size + offset); works on ints and tensors alike."""
    if isinstance(positions, torch.Tensor):
        table = torch.as_tensor(table, dtype=torch.int64)
        return table[positions // block_size] * block_size + positions % block_size
    return [table[p // block_size] * block_size + p % block_size for p in positions]


def block_table_tensor(tables: list, width: int) -> torch.Tensor:
    """[len(tables), width] int32, each row its table then zeros."""
    out = torch.zeros(len(tables), width, dtype=torch.int32)
    for i, t in enumerate(tables):
        out[i, : len(t)] = torch.as_tensor(t, dtype=torch.int32)
    return out
