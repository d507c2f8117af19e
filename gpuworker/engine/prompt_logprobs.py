"""Prompt logprobs (vLLM's ``prompt_logprobs``): for every prompt token after
the first, the log-softmax of the model's raw logits at the position before it,
as {token: logprob} with the top N plus the actual prompt token.

Filled in as prefill chunks run (chunked prefill: each chunk adds its share),
into ``request.prompt_logprobs`` (entry 0 is None: the first token has no
context). A request that asks for them never takes prefix-cache hits over
positions whose logits are still missing (see KVCacheManager), and after a
preemption the positions already recorded are not recorded again.
"""
from __future__ import annotations

import torch

from inferq.gpuworker.engine.sampler import prompt_logprobs_of

# Logits of this many prompt positions at a time (bounds memory: rows x vocab floats).
_ROWS_PER_SLICE = 256


def collect_prompt_logprobs(model, hidden: torch.Tensor, scheduled, query_start_loc: list[int]) -> None:
    for i, s in enumerate(scheduled):
        req = s.request
        out = req.prompt_logprobs
        if out is None:
            continue
        n_prompt = req.num_prompt_tokens
        start = s.num_computed_before
        # Position j predicts prompt token j + 1; record only what is missing.
        first = max(start, len(out) - 1)
        last = min(start + s.num_new_tokens, n_prompt - 1)  # exclusive
        if first >= last:
            continue
        if first != len(out) - 1:
            raise AssertionError(f"prompt logprobs of {req.request_id} would skip positions {len(out) - 1}..{first}")
        top_n = req.params.prompt_logprobs
        for a in range(first, last, _ROWS_PER_SLICE):
            b = min(last, a + _ROWS_PER_SLICE)
            rows = torch.arange(a - start, b - start, device=hidden.device) + query_start_loc[i]
            logits = model.compute_logits(hidden.index_select(0, rows))
            out.extend(prompt_logprobs_of(logits, req.prompt_token_ids[a + 1 : b + 1], top_n))
