"""Runs one scheduled step through the model: flatten, forward, sample."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from gpuworker.attention.base import AttentionMetadata
from gpuworker.engine.kv_cache_manager import KVCacheManager
from gpuworker.engine.prompt_logprobs import collect_prompt_logprobs
from gpuworker.engine.sampler import Sampler, SamplingRow
from gpuworker.engine.scheduler import ScheduledRequest, SchedulerOutput


@dataclass
class SampledToken:
    scheduled: ScheduledRequest
    token_id: int
    logprobs: Optional[dict[int, float]]


class ModelRunner:
    def __init__(self, model, kv_caches, block_size: int, device: torch.device):
        self.model = model
        self.kv_caches = kv_caches
        self.block_size = block_size
        self.device = device
        self.sampler = Sampler()
        self.graphs = None  # DecodeGraphs on CUDA, set by the engine after capture

    def build_metadata(self, sched: SchedulerOutput, kv: KVCacheManager):
        """One flattened varlen batch: every scheduled token of every request."""
        bs = self.block_size
        input_ids: list[int] = []
        positions: list[int] = []
        seq_index: list[int] = []
        query_lens: list[int] = []
        seq_lens: list[int] = []
        tables: list[list[int]] = []
        for i, s in enumerate(sched.scheduled):
            req = s.request
            start, end = s.num_computed_before, s.num_computed_before + s.num_new_tokens
            input_ids.extend(req.all_token_ids[start:end])
            positions.extend(range(start, end))
            seq_index.extend([i] * s.num_new_tokens)
            query_lens.append(s.num_new_tokens)
            seq_lens.append(end)
            tables.append(kv.block_ids(req.request_id))

        width = max(len(t) for t in tables)
        block_tables = torch.zeros((len(tables), width), dtype=torch.int32)
        for i, t in enumerate(tables):
            block_tables[i, : len(t)] = torch.tensor(t, dtype=torch.int32)
        pos_t = torch.tensor(positions, dtype=torch.int64)
        seq_t = torch.tensor(seq_index, dtype=torch.int64)
        # slot = physical block * block_size + offset inside the block
        slot_mapping = block_tables[seq_t, pos_t // bs].to(torch.int64) * bs + pos_t % bs
        qsl = [0]
        for q in query_lens:
            qsl.append(qsl[-1] + q)
        dev = self.device
        meta = AttentionMetadata(
            slot_mapping=slot_mapping.to(dev),
            query_start_loc=torch.tensor(qsl, dtype=torch.int32, device=dev),
            seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=dev),
            context_lens=torch.tensor([s - q for s, q in zip(seq_lens, query_lens)], dtype=torch.int32, device=dev),
            block_tables=block_tables.to(dev),
            max_query_len=max(query_lens),
            max_seq_len=max(seq_lens),
            block_size=bs,
            query_lens_cpu=query_lens,
            seq_lens_cpu=seq_lens,
        )
        ids = torch.tensor(input_ids, dtype=torch.int64, device=dev)
        return ids, pos_t.to(dev), meta, qsl

    @torch.inference_mode()
    def execute(self, sched: SchedulerOutput, kv: KVCacheManager) -> list[SampledToken]:
        ids, positions, meta, qsl = self.build_metadata(sched, kv)
        if self.graphs is not None and self.graphs.can_run(meta):
            hidden = self.graphs.run(ids, positions, meta)
        else:
            hidden = self.model(ids, positions, self.kv_caches, meta)
        if any(s.request.prompt_logprobs is not None for s in sched.scheduled):
            collect_prompt_logprobs(self.model, hidden, sched.scheduled, qsl)
        # Logits only for rows that sample: the last token of each finished prompt/decode.
        sampling = [(i, s) for i, s in enumerate(sched.scheduled) if s.samples]
        if not sampling:
            return []
        rows_idx = torch.tensor([qsl[i + 1] - 1 for i, _ in sampling], device=hidden.device)
        logits = self.model.compute_logits(hidden.index_select(0, rows_idx)).float()
        rows = [
            SamplingRow(
                params=s.request.params,
                prompt_token_ids=s.request.prompt_token_ids,
                output_token_ids=s.request.output_token_ids,
                generator=s.request.generator,
            )
            for _, s in sampling
        ]
        out = self.sampler(logits, rows)
        return [SampledToken(s, t, lp) for (_, s), t, lp in zip(sampling, out.token_ids, out.logprobs)]
