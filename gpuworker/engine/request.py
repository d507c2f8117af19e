"""One generation request as the engine tracks it."""
from __future__ import annotations

import enum
import time
from typing import Optional

from inferq.gpuworker.engine.sampler import _is_plain_greedy
from inferq.schemas import SamplingParams


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    PREEMPTED = "preempted"  # lost its blocks; waits to be recomputed
    FINISHED = "finished"


class Request:
    """Token bookkeeping in vLLM V1 style.

    There are no prefill/decode phases: a request has ``num_tokens`` known tokens
    (prompt + generated) of which ``num_computed_tokens`` have KV in the cache.
    Each step the scheduler hands it ``num_tokens - num_computed_tokens`` (capped
    by the budget) new tokens; when it catches up it samples one more token.

    Slotted: every step reads a few fields of every running request, and fixed
    slots are fewer cache lines to bring back after a forward has evicted them.
    """

    __slots__ = (
        "request_id", "prompt_token_ids", "num_prompt_tokens", "params", "priority", "arrival_time", "deadline", "eos_token_ids",
        "plain_greedy", "finishing_token_ids", "wants_logprobs", "max_tokens", "all_token_ids",
        "output_token_ids", "prompt_logprobs", "prompt_logprobs_sent", "num_computed_tokens",
        "num_cached_tokens", "num_preemptions", "status", "finish_reason", "block_hashes",
        "detokenizer", "penalty_tokens", "matcher", "reasoning_gate", "bias_tensors", "shapes_logits", "spec_token_ids",
        "token_seed", "pooling", "pooled",
    )

    def __init__(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        priority: int = 0,
        arrival_time: Optional[float] = None,
        deadline: Optional[float] = None,
        eos_token_ids: tuple[int, ...] = (),
    ):
        self.request_id = request_id
        self.prompt_token_ids = list(prompt_token_ids)
        self.num_prompt_tokens = len(self.prompt_token_ids)  # the prompt never changes
        self.params = params
        self.priority = priority
        self.arrival_time = time.time() if arrival_time is None else arrival_time
        self.deadline = deadline
        self.eos_token_ids = eos_token_ids
        # Greedy, no logprobs, no penalties: the model runner's argmax fast path.
        # Worked out once here, not per step.
        self.plain_greedy = _is_plain_greedy(params)
        self.shapes_logits = params.shapes_logits  # bias, min_tokens or a constraint (logits_shaping)
        # Token ids that may end the request (stop tokens, plus EOS unless ignored):
        # one set test per sampled token instead of two reads of the params.
        self.finishing_token_ids = frozenset(params.stop_token_ids or ()) | (
            frozenset() if params.ignore_eos else frozenset(eos_token_ids))
        self.wants_logprobs = params.logprobs is not None
        self.max_tokens = params.max_tokens

        self.all_token_ids: list[int] = list(prompt_token_ids)
        self.output_token_ids: list[int] = []
        # Prompt logprobs, filled in by prefill chunks (entry 0: None); sent with the first delta.
        self.prompt_logprobs: Optional[list[Optional[dict[int, float]]]] = (
            None if params.prompt_logprobs is None else [None]
        )
        self.prompt_logprobs_sent = False
        self.num_computed_tokens = 0
        self.num_cached_tokens = -1  # prefix-cache hit on first schedule; -1 = not yet scheduled
        self.num_preemptions = 0
        self.status = RequestStatus.WAITING
        self.finish_reason: Optional[str] = None
        # Chain hashes of this request's full blocks, extended as blocks fill.
        self.block_hashes: list[bytes] = []
        # Filled in by the engine: the incremental detokenizer.
        self.detokenizer = None
        self.penalty_tokens = None  # PenaltyTokens when the request uses penalties
        # Structured outputs: the request's llguidance matcher, advanced by every
        # output token. Preemption keeps the output tokens, so it stays valid.
        self.matcher = None
        # A reasoning model's matcher waits here until the reasoning has ended (engine/grammar.py).
        self.reasoning_gate = None
        self.bias_tensors = None  # logit_bias as (ids, values) tensors, see logits_shaping
        # Speculative decoding: tokens proposed to follow all_token_ids, verified in
        # this step's forward (set before scheduling, cleared after the step).
        self.spec_token_ids: list[int] = []
        # A seeded request draws output token i from draws keyed by (seed, i)
        # (engine/keyed_draws.py): the same whatever step, batch or attempt.
        self.token_seed: Optional[int] = None
        # A pooling request (embeddings, engine/pooling.py): its Pooling, and the vector
        # its prompt chunks build up; it samples nothing and ends after its prompt.
        self.pooling = None
        self.pooled = None

    @property
    def num_tokens(self) -> int:
        return len(self.all_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def is_finished(self) -> bool:
        return self.status is RequestStatus.FINISHED

    def append_output_token(self, token_id: int) -> None:
        self.all_token_ids.append(token_id)
        self.output_token_ids.append(token_id)

    def sort_key(self) -> tuple:
        """Lower sorts first: served earlier, preempted later."""
        return (self.priority, self.arrival_time)

    def __repr__(self) -> str:
        return (
            f"Request({self.request_id!r}, status={self.status.value}, "
            f"computed={self.num_computed_tokens}/{self.num_tokens})"
        )
