"""Pooling requests (embeddings): a prompt's final hidden states (after the
model's last norm) as one vector, and no sampling.

A pooling request runs its prompt through the continuous batch like any other
(chunked prefill, paged KV) and ends with its last prompt chunk. Each chunk adds
its share here, into ``request.pooled`` on the device in float64:

* ``last``: the hidden state of the last prompt token (what decoder-only
  embedding models such as Qwen3-Embedding or e5-mistral are trained for);
* ``mean``: the sum over every prompt position, divided by the prompt length at
  the end. The sum is float64: float32 rows add up exactly (or within float64's
  rounding), so the result does not depend on how the prompt was chunked. A mean
  needs every position's hidden state, so these requests take no prefix-cache
  hits (KVCacheManager); a preempted one starts its sum again from position 0.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch

POOLING_TYPES = ("mean", "last")


@dataclass(frozen=True)
class Pooling:
    """``kind`` None: the engine's default (EngineConfig.pooling)."""

    kind: Optional[str] = None
    normalize: bool = True

    def __post_init__(self) -> None:
        if self.kind is not None and self.kind not in POOLING_TYPES:
            raise ValueError(f"unknown pooling {self.kind!r}; choose from {', '.join(POOLING_TYPES)}")


def pooling_rows(scheduled) -> list[tuple[int, object]]:
    """(index in the schedule, scheduled request) of every pooling request of a step."""
    return [(i, s) for i, s in enumerate(scheduled) if s.request.pooling is not None]


def accumulate(hidden: torch.Tensor, rows: list, query_start_loc) -> None:
    """Add this step's hidden rows of each pooling request to its ``pooled``.
    ``hidden``: [tokens of the step, hidden size], every row of the step."""
    for i, s in rows:
        req = s.request
        start, end = int(query_start_loc[i]), int(query_start_loc[i + 1])
        first = s.num_computed_before
        if req.pooling.kind == "last":
            if first + s.num_new_tokens == req.num_prompt_tokens:
                req.pooled = hidden[end - 1].double()
            continue
        if first == 0:
            req.pooled = None  # a new start (first chunk, or recomputed after a preemption)
        elif req.pooled is None:
            raise AssertionError(f"mean pooling of {req.request_id} would miss positions 0..{first}")
        part = hidden[start:end].double().sum(0)
        req.pooled = part if req.pooled is None else req.pooled + part


def finished_vector(req) -> np.ndarray:
    """The request's vector (float32, on the host) once its whole prompt has run."""
    v = req.pooled
    if req.pooling.kind == "mean":
        v = v / req.num_prompt_tokens
    if req.pooling.normalize:
        v = v / v.norm().clamp_min(1e-12)
    return v.float().cpu().numpy()
