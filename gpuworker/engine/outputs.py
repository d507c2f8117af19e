"""What the engine hands back from each step."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional


@dataclass(slots=True)
class RequestDelta:
    """New output of one request from one ``step()``.

    ``new_text`` is what may be shown now: text that could still turn into a
    stop string is held back until it is decided. ``finish_reason`` is one of
    ``stop`` | ``length`` | ``abort`` | ``deadline`` once ``finished``.
    """

    request_id: str
    new_token_ids: list[int]
    new_text: str
    finished: bool = False
    finish_reason: Optional[str] = None
    # One dict per new token: top-N {token_id: logprob} plus the sampled token.
    logprobs: Optional[list[dict[int, float]]] = None
    num_prompt_tokens: int = 0
    num_output_tokens: int = 0
    num_cached_tokens: int = 0
    # Which stop string or token ended the request, if any.
    stop_reason: Optional[object] = None
    # With the request's first delta, when it asked for prompt_logprobs: one entry
    # per prompt token (None for the first), top-N plus the actual token.
    prompt_logprobs: Optional[list[Optional[dict[int, float]]]] = None
    # Set by the worker for jobs with several choices (gpuworker/service/choices.py):
    # which choice this is, that choice's end (while others may go on), and with the
    # job's final delta every choice's end.
    index: int = 0
    choice_end: Optional[str] = None
    choices: Optional[list] = None
    # A pooling request's (embeddings) only delta: its vector, float32 numpy on the host.
    embedding: Optional[object] = None


@dataclass
class CompletionOutput:
    """The whole result of one prompt from ``LLM.generate``."""

    request_id: str
    prompt_token_ids: list[int]
    token_ids: list[int]
    text: str
    finish_reason: Optional[str]
    logprobs: Optional[list[dict[int, float]]] = None
    num_cached_tokens: int = 0
    prompt_logprobs: Optional[list[Optional[dict[int, float]]]] = None
    # With n > 1: every sample of the prompt, this output first.
    samples: list["CompletionOutput"] = field(default_factory=list, compare=False, repr=False)


@dataclass
class EmbeddingOutput:
    """The pooled vector of one prompt from ``LLM.embed``."""

    request_id: str
    prompt_token_ids: list[int]
    embedding: list[float]


@dataclass
class EngineStats:
    num_running: int
    num_waiting: int
    kv_cache_usage: float  # fraction of blocks in use, 0..1
    num_blocks: int
    num_free_blocks: int
    prefix_cache_queries: int  # tokens looked up
    prefix_cache_hits: int  # tokens found
    num_preemptions: int  # every recompute preemption (KV exhaustion + priority)
    num_steps: int
    num_generated_tokens: int
    num_prompt_tokens: int
    # Of num_preemptions: running requests evicted for a waiting request of better
    # priority (priority policy); the rest were evicted because blocks ran out.
    num_priority_preemptions: int = 0
    # Speculative decoding's counters (gpuworker/engine/speculative/controller.SpecStats), when it is on.
    spec: Optional[object] = None
