"""CUDA graphs for decode-only steps (CUDA + Triton backend only).

A decode step of a small model is dominated by kernel launches. For batch
sizes 1, 2, 4, 8, 16, ... up to max_num_seqs the whole forward is captured
once and replayed: the batch is padded up to the next captured size, padding
rows write nowhere (slot -1) and attend to one token of block 0, and their
outputs are ignored. Mixed or prefill steps and bigger batches run eagerly.

Graphs bake in every launch configuration, so each size is captured with a
fixed split-K count: the one the eager path's chooser (``choose_num_kv_splits``,
used by ``unified_attention``) picks for a decode step of that many sequences at
the longest context a replay may see. In batch-invariant mode (the backend's
``batch_invariant``) every size gets the same count instead: enough segments of the
fixed ``kv_split_tokens`` keys for that context, which is what an eager step gives a
row too (the segments past a row's keys weigh exactly 0), so a replayed row has the
eager row's bits whatever the graph size. A self-check compares a replay against
the eager forward before the graphs are trusted, within a few roundings of the
model's dtype; any mismatch or capture error falls back to eager execution with
a warning.
"""
from __future__ import annotations

import logging
from typing import Optional

import torch

from inferq.gpuworker.attention.base import AttentionMetadata
from inferq.kernels.runtime import num_compute_units
from inferq.kernels.split_k_decode import choose_num_kv_splits, invariant_num_kv_splits

log = logging.getLogger(__name__)

# Replay and eager forward may sum in another order (another split-K, another
# launch shape), so they may differ by a few roundings of the model's dtype,
# amplified a little by the layers; a stale or wrong input differs by O(1).
SELF_CHECK_ROUNDINGS = 8
# Never tighter than this relative step (fp32 models: sums of thousands of terms).
_MIN_RELATIVE_STEP = 2.0**-16


def graph_num_kv_splits(num_seqs: int, num_kv_heads: int, max_seq_len: int, compute_units: int,
                        kv_split_tokens: int | None = None) -> int:
    """Split-K of the graph for ``num_seqs`` sequences: the eager chooser's pick for a
    decode step of that many at ``max_seq_len``. Long contexts are what split-K is for;
    on a shorter one the extra segments are empty and return at once. Batch-invariant
    mode (``kv_split_tokens``): the fixed-size segments ``max_seq_len`` needs, any size."""
    if kv_split_tokens is not None:
        return invariant_num_kv_splits(max_seq_len, kv_split_tokens)
    return choose_num_kv_splits(num_seqs, num_kv_heads, 1, max_seq_len, compute_units)


def replay_matches_eager(replayed: torch.Tensor, eager: torch.Tensor) -> tuple[bool, float]:
    """Whether a replay's output equals the eager one up to rounding, and the worst
    difference in units of the allowed one (> 1: a mismatch).

    Allowed per element: ``SELF_CHECK_ROUNDINGS`` relative steps of the dtype (bf16
    2^-8, fp16 2^-11) times the element's magnitude plus its row's mean magnitude;
    an element near zero carries the rounding of the larger values it was summed from.
    NaN or inf where the other is finite is a mismatch."""
    a, b = replayed.float(), eager.float()
    step = max(torch.finfo(eager.dtype).eps / 2, _MIN_RELATIVE_STEP)
    magnitude = b.abs()
    allowed = SELF_CHECK_ROUNDINGS * step * (magnitude + magnitude.mean(dim=-1, keepdim=True))
    ratio = ((a - b).abs() / allowed.clamp_min(torch.finfo(torch.float32).tiny)).nan_to_num(nan=float("inf"))
    same_nonfinite = (a == b) & ~torch.isfinite(b)  # equal infinities: the same value
    worst = float(ratio.masked_fill(same_nonfinite, 0.0).max()) if ratio.numel() else 0.0
    return worst <= 1.0, worst


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
        num_kv_heads = kv_caches[0][0].shape[2]  # [blocks, block size, kv heads, head dim]
        units = num_compute_units(torch.device(device))
        split_tokens = getattr(backend, "split_tokens", None)  # set in batch-invariant mode
        self.num_kv_splits = {n: graph_num_kv_splits(n, num_kv_heads, max_model_len, units, split_tokens)
                              for n in self.sizes}
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
        try:
            pool = None
            stream = torch.cuda.Stream(self.device)
            stream.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(stream):
                for n in reversed(self.sizes):  # largest first so smaller graphs reuse its pool
                    self.backend.num_kv_splits = self.num_kv_splits[n]
                    self._forward(n)  # warm-up: compiles the Triton kernels for this shape
                    g = torch.cuda.CUDAGraph()
                    with torch.cuda.graph(g, pool=pool, stream=stream):
                        self.outputs[n] = self._forward(n)
                    pool = g.pool()
                    self.graphs[n] = g
            torch.cuda.current_stream(self.device).wait_stream(stream)
            self.backend.num_kv_splits = saved  # the self-check's eager forward chooses as a step would
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
        ok, worst = replay_matches_eager(replayed, eager)
        if not ok:
            log.warning("CUDA graph replay differs from eager by %.3g x the rounding allowed; decoding eagerly", worst)
        return ok

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
