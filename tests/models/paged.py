"""A minimal paged-cache driver for model tests: it plays the model runner's part
(block tables, slot mapping, AttentionMetadata) without the scheduler, so model
and backend can be checked on their own."""
from __future__ import annotations

import random

import torch

from inferq.gpuworker.attention.base import AttentionBackend, AttentionMetadata
from tests.paging import block_table_tensor, slots


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


class PagedDriver:
    """Feeds token chunks of several sequences through a model over a paged cache.
    Blocks are handed out in shuffled order so block tables are never contiguous."""

    def __init__(self, model, backend: AttentionBackend, block_size: int = 16, num_blocks: int = 256, seed: int = 0):
        cfg = model.config
        self.model = model
        self.block_size = block_size
        self.kv = backend.allocate_kv_cache(
            cfg.num_layers, num_blocks, block_size, cfg.num_kv_heads, cfg.head_dim, model.dtype, torch.device("cpu")
        )
        self.free = list(range(num_blocks))
        random.Random(seed).shuffle(self.free)
        self.tables: dict[int, list[int]] = {}
        self.cached: dict[int, int] = {}

    def step(self, work: list[tuple[int, list[int]]], last_rows_only: bool = False) -> list[torch.Tensor]:
        """work: (sequence id, new token ids) per sequence. Returns fp32 logits
        [len(new tokens), vocab] for each sequence, in order; ``last_rows_only``: only each
        chunk's last row ([1, vocab] each), through the forward's ``keep_rows`` as the model
        runner asks for its sampling rows."""
        chunks, tables, ids = [], [], []
        for sid, tokens in work:
            ctx = self.cached.get(sid, 0)
            table = self.tables.setdefault(sid, [])
            while len(table) * self.block_size < ctx + len(tokens):
                table.append(self.free.pop())
            chunks.append((ctx, len(tokens)))
            tables.append(table)
            ids += tokens
            self.cached[sid] = ctx + len(tokens)
        meta, positions = build_metadata(chunks, tables, self.block_size)
        if last_rows_only:
            last = meta.query_start_loc[1:].long() - 1
            hidden = self.model(torch.tensor(ids, dtype=torch.int64), positions, self.kv, meta, keep_rows=last)
            return list(self.model.compute_logits(hidden).split(1))
        hidden = self.model(torch.tensor(ids, dtype=torch.int64), positions, self.kv, meta)
        logits = self.model.compute_logits(hidden)
        return list(logits.split([q for _, q in chunks]))
