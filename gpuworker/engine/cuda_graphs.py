"""CUDA graphs for decode-only steps (CUDA + Triton backend only).

A decode step of a small model is dominated by kernel launches. For batch
sizes 1, 2, 4, 8, 16, ... up to max_num_seqs the whole forward is captured
once and replayed: the batch is padded up to the next captured size, padding
rows write nowhere (slot -1) and attend to one token of block 0, and their
outputs are ignored. Mixed or prefill steps and bigger batches run eagerly.

Graphs bake in every launch configuration, so capture runs with a fixed
split-K count, and a self-check compares a replay against the eager forward
before the graphs are trusted; any mismatch or capture error falls back to
eager execution with a warning.
"""
from __future__ import annotations

import logging
from typing import Optional

import torch

from inferq.gpuworker.attention.base import AttentionMetadata

log = logging.getLogger(__name__)

GRAPH_KV_SPLITS = 4


def capture_sizes(max_num_seqs: int) -> list[int]:
    sizes, n = [], 1
    while n <= max_num_seqs and n <= 512:
        sizes.append(n)
        n *= 2
    return sizes


class DecodeGraphs:
    def __init__(self, model, kv_caches, backend, block_size: int, max_model_len: int, max_num_seqs: int, device):
        self.model = model
        self.kv_caches = kv_caches
        self.backend = backend
        self.block_size = block_size
        self.device = device
        self.sizes = capture_sizes(max_num_seqs)
        n = self.sizes[-1]
        self.max_blocks = -(-max_model_len // block_size)
        self.max_seq_len = max_model_len
        i32 = dict(dtype=torch.int32, device=device)
        self.ids = torch.zeros(n, dtype=torch.int64, device=device)
        self.positions = torch.zeros(n, dtype=torch.int64, device=device)
        self.slots = torch.full((n,), -1, dtype=torch.int64, device=device)
        self.qsl = torch.arange(n + 1, **i32)
        self.seq_lens = torch.ones(n, **i32)
        self.ctx_lens = torch.zeros(n, **i32)
        self.block_tables = torch.zeros((n, self.max_blocks), **i32)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, torch.Tensor] = {}

    def _meta(self, n: int) -> AttentionMetadata:
        return AttentionMetadata(
            slot_mapping=self.slots[:n],
            query_start_loc=self.qsl[: n + 1],
            seq_lens=self.seq_lens[:n],
            context_lens=self.ctx_lens[:n],
            block_tables=self.block_tables[:n],
            max_query_len=1,
            max_seq_len=self.max_seq_len,
            block_size=self.block_size,
            query_lens_cpu=[1] * n,
            seq_lens_cpu=[1] * n,  # not read by the triton backend
        )

    def _forward(self, n: int) -> torch.Tensor:
        return self.model(self.ids[:n], self.positions[:n], self.kv_caches, self._meta(n))

    @torch.inference_mode()
    def capture(self) -> bool:
        saved = self.backend.num_kv_splits
        self.backend.num_kv_splits = GRAPH_KV_SPLITS
        try:
            pool = None
            stream = torch.cuda.Stream(self.device)
            stream.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(stream):
                for n in reversed(self.sizes):  # largest first so smaller graphs reuse its pool
                    self._forward(n)  # warm-up: compiles the Triton kernels for this shape
                    g = torch.cuda.CUDAGraph()
                    with torch.cuda.graph(g, pool=pool, stream=stream):
                        self.outputs[n] = self._forward(n)
                    pool = g.pool()
                    self.graphs[n] = g
            torch.cuda.current_stream(self.device).wait_stream(stream)
            ok = self._self_check()
        except Exception as e:  # capture is an optimisation: never fatal
            log.warning("CUDA graph capture failed, decoding eagerly: %r", e)
            ok = False
        finally:
            self.backend.num_kv_splits = saved
        if not ok:
            self.graphs.clear()
            self.outputs.clear()
        return ok

    def _self_check(self) -> bool:
        """Replay vs eager on the same (write-nothing) inputs."""
        n = self.sizes[min(2, len(self.sizes) - 1)]
        self.ids[:n] = torch.arange(n, device=self.device) + 1
        self.positions[:n] = 0
        self.graphs[n].replay()
        replayed = self.outputs[n].clone()
        eager = self._forward(n)
        err = (replayed.float() - eager.float()).abs().max().item()
        if err > 1e-2:
            log.warning("CUDA graph replay differs from eager by %.3g; decoding eagerly", err)
            return False
        return True

    def can_run(self, meta: AttentionMetadata) -> bool:
        return bool(self.graphs) and meta.max_query_len == 1 and meta.num_seqs <= self.sizes[-1]

    def run(self, ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        b = meta.num_seqs
        n = next(s for s in self.sizes if s >= b)
        width = meta.block_tables.shape[1]
        self.ids[:b].copy_(ids)
        self.positions[:b].copy_(positions)
        self.slots[:b].copy_(meta.slot_mapping)
        self.slots[b:n].fill_(-1)
        self.seq_lens[:b].copy_(meta.seq_lens)
        self.seq_lens[b:n].fill_(1)
        self.ctx_lens[:b].copy_(meta.context_lens)
        self.block_tables[:b, :width].copy_(meta.block_tables)
        self.block_tables[b:n].zero_()
        self.graphs[n].replay()
        return self.outputs[n][:b]
