"""Proposals from a smaller model of the same tokenizer (a draft model).

The draft keeps a KV cache of its own with the target's block layout and reads
it through the *target's* block tables: a request's token at position p has
its draft K/V in the same block and slot as its target K/V, so there is no
second allocator, and blocks freed by the target (finish, preemption, rejected
proposals) free the draft's too.

Per step, for the requests that speculate: their target slots for the k + 1
positions the verification needs are allocated here (the scheduler then finds
them in place); one batched draft forward catches each request up on the
tokens it has not seen (its whole prompt the first time, else the few tokens
accepted since) and drafts token 1; k - 1 one-token forwards draft the rest.
Drafts are the draft model's argmax (a single token per position, which is what
speculative.verify's acceptance is exact for, greedy and sampled).

A request's draft KV is valid for its first ``_seen`` positions: after a
verification that accepted a of n proposals, the tokens before the correction
(``L + min(a, n - 1)`` where ``L`` was its length when it proposed); a
preemption (its blocks were freed) starts it again from 0.
"""
from __future__ import annotations

import numpy as np
import torch

from inferq.gpuworker.attention.base import AttentionMetadata, get_backend
from inferq.gpuworker.engine.request import Request
from inferq.gpuworker.engine.sampler import greedy_argmax
from inferq.gpuworker.engine.speculative.config import SpeculativeConfig
from inferq.gpuworker.engine.speculative.proposer import Proposer
from inferq.gpuworker.models.loader import load_model


class DraftModelProposer(Proposer):
    def __init__(self, config: SpeculativeConfig, engine):
        self.k = config.k
        self.kv = engine.kv
        self.device = engine.device
        # A backend of its own: the torch backend keeps one plan per step's metadata.
        backend = get_backend(engine.backend.name)
        loaded = load_model(config.model, dtype=engine.dtype, device=engine.device, backend=backend)
        target = engine.model_config
        if loaded.config.vocab_size > target.vocab_size:
            raise ValueError(f"the draft model's vocabulary ({loaded.config.vocab_size}) is larger than the "
                             f"target's ({target.vocab_size}): it must use the same tokenizer")
        self.model = loaded.model
        if engine.device.type == "cpu":
            if hasattr(self.model, "prepack_cpu_weights") and engine.config.prepack_weights is not False:
                self.model.prepack_cpu_weights(kernels=engine.config.cpu_kernels is not False)
            if engine.config.cpu_kernels is not False:
                self.model.use_cpu_kernels()
        mc = loaded.config
        self.kv_caches = backend.allocate_kv_cache(mc.num_layers, self.kv.pool.num_blocks, self.kv.block_size,
                                                   mc.num_kv_heads, mc.head_dim, engine.dtype, engine.device)
        self._seen: dict[str, tuple[int, int]] = {}  # request id -> (its num_preemptions, valid positions)
        self._length_at_proposal: dict[str, int] = {}

    # ------------------------------------------------------------------ proposing
    def propose(self, requests: list[Request], limits: list[int]) -> list[list[int]]:
        drafts: list[list[int]] = [[] for _ in requests]
        live = []
        for i, (req, limit) in enumerate(zip(requests, limits)):
            # Slots for the last known token and every proposal (the verification's k + 1).
            if self.kv.allocate_slots(req, 1 + limit):
                live.append(i)
        if not live:
            return drafts
        items = []
        for i in live:
            req = requests[i]
            preemptions, seen = self._seen.get(req.request_id, (req.num_preemptions, 0))
            if preemptions != req.num_preemptions:
                seen = 0  # its blocks were freed and recomputed: the draft KV went with them
            n = len(req.all_token_ids)
            items.append((req, seen, req.all_token_ids[seen:n]))
            self._seen[req.request_id] = (req.num_preemptions, n)
            self._length_at_proposal[req.request_id] = n
        tokens = self._forward(items)
        for i, t in zip(live, tokens):
            drafts[i].append(t)
        for j in range(1, max(limits[i] for i in live)):
            step = [i for i in live if limits[i] > j]
            if not step:
                break
            items = [(requests[i], len(requests[i].all_token_ids) + j - 1, [drafts[i][-1]]) for i in step]
            for i, t in zip(step, self._forward(items)):
                drafts[i].append(t)
        return drafts

    def accepted(self, req: Request, num_proposed: int, num_accepted: int) -> None:
        length = self._length_at_proposal.pop(req.request_id, None)
        if length is not None:
            # The accepted drafts' KV was written while drafting, except the last proposal's.
            self._seen[req.request_id] = (req.num_preemptions, length + min(num_accepted, num_proposed - 1))

    def finished(self, request_id: str) -> None:
        self._seen.pop(request_id, None)
        self._length_at_proposal.pop(request_id, None)

    # ------------------------------------------------------------------ the draft's forward
    @torch.inference_mode()
    def _forward(self, items: list[tuple[Request, int, list[int]]]) -> list[int]:
        """One varlen draft forward: each item's tokens from its start position;
        returns the argmax after each item's last token."""
        bs = self.kv.block_size
        ids, positions, slots, q_lens, seq_lens, starts, tables = [], [], [], [], [], [], []
        for req, start, toks in items:
            block_ids = self.kv.req_block_ids[req.request_id]
            pos = np.arange(start, start + len(toks))
            table = np.asarray(block_ids, dtype=np.int64)
            ids.extend(toks)
            positions.append(pos)
            slots.append(table[pos // bs] * bs + pos % bs)
            q_lens.append(len(toks))
            seq_lens.append(start + len(toks))
            starts.append(start)
            tables.append(table)
        width = max(-(-s // bs) for s in seq_lens)
        block_tables = np.zeros((len(items), width), dtype=np.int32)
        for row, table in enumerate(tables):
            n = min(width, len(table))
            block_tables[row, :n] = table[:n]
        dev = self.device
        qsl = np.zeros(len(items) + 1, dtype=np.int64)
        np.cumsum(q_lens, out=qsl[1:])
        meta = AttentionMetadata(
            slot_mapping=torch.from_numpy(np.concatenate(slots)).to(dev),
            query_start_loc=torch.from_numpy(qsl.astype(np.int32)).to(dev),
            seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=dev),
            context_lens=torch.tensor(starts, dtype=torch.int32, device=dev),
            block_tables=torch.from_numpy(block_tables).to(dev),
            max_query_len=max(q_lens), max_seq_len=max(seq_lens), block_size=bs,
            query_lens_cpu=q_lens, seq_lens_cpu=seq_lens, all_slots_valid=True,
        )
        hidden = self.model(torch.tensor(ids, dtype=torch.long, device=dev),
                            torch.from_numpy(np.concatenate(positions)).to(dev), self.kv_caches, meta)
        last = torch.from_numpy(qsl[1:] - 1).to(dev)
        return greedy_argmax(self.model.lm_logits(hidden.index_select(0, last))).tolist()
