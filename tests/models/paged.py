"""A minimal paged-cache driver for model tests: it plays the model runner's part
(block tables, slot mapping, AttentionMetadata) without the scheduler, so model
and backend can be checked on their own."""
from __future__ import annotations

import random

import torch

from inferq.bench.paged_metadata import build_metadata
from inferq.gpuworker.attention.base import AttentionBackend


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
