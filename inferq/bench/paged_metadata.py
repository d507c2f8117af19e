"""One step's paged-attention metadata built by hand, without the scheduler or the
model runner: the attention micro-benchmarks (decode-attention, prefill-attention)
time a backend on it, and the kernel and model tests drive kernels and models with it."""
from __future__ import annotations

import torch

from inferq.gpuworker.attention.base import AttentionMetadata


def slots(table, positions, block_size: int):
    """Cache slots of ``positions`` for a sequence with block ``table``
    (slot = block id * block_size + offset); works on ints and tensors alike."""
    if isinstance(positions, torch.Tensor):
        table = torch.as_tensor(table, dtype=torch.int64)
        return table[positions // block_size] * block_size + positions % block_size
    return [table[p // block_size] * block_size + p % block_size for p in positions]


def block_table_tensor(tables: list, width: int) -> torch.Tensor:
    """[len(tables), width] int32, each row its table then zeros (as the model runner lays them out)."""
    out = torch.zeros(len(tables), width, dtype=torch.int32)
    for i, t in enumerate(tables):
        out[i, : len(t)] = torch.as_tensor(t, dtype=torch.int32)
    return out


def build_metadata(
    chunks: list[tuple[int, int]],  # per sequence: (context_len, query_len)
    tables: list[list[int]],
    block_size: int,
    device: torch.device | str = "cpu",
) -> tuple[AttentionMetadata, torch.Tensor]:
    """Return (metadata, positions) for one step."""
    slot_mapping, positions, qsl, seq_lens, ctx_lens = [], [], [0], [], []
    for (ctx, q_len), table in zip(chunks, tables):
        span = range(ctx, ctx + q_len)
        slot_mapping += slots(table, span, block_size)
        positions += span
        qsl.append(qsl[-1] + q_len)
        seq_lens.append(ctx + q_len)
        ctx_lens.append(ctx)
    bt = block_table_tensor(tables, max(len(t) for t in tables))
    q_lens = [q for _, q in chunks]
    meta = AttentionMetadata(
        slot_mapping=torch.tensor(slot_mapping, dtype=torch.int64, device=device),
        query_start_loc=torch.tensor(qsl, dtype=torch.int32, device=device),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=device),
        context_lens=torch.tensor(ctx_lens, dtype=torch.int32, device=device),
        block_tables=bt.to(device),
        max_query_len=max(q_lens),
        max_seq_len=max(seq_lens),
        block_size=block_size,
        query_lens_cpu=q_lens,
        seq_lens_cpu=seq_lens,
    )
    return meta, torch.tensor(positions, dtype=torch.int64, device=device)
