"""One job's choices (sampling.n > 1) as sibling engine requests.

Choice 0 runs under the job's own id, choice i under ``"<job>#<i>"``. Choices
1..n-1 are added only once choice 0's prompt is computed: its full blocks are
then in the prefix cache, so the siblings reuse the prompt's KV blocks instead
of computing (and holding) their own copies. ``translate`` turns the engine's
per-request deltas into the job's: each tagged with its choice ``index``; a
choice that ends while others run becomes a delta with ``choice_end`` set, and
the last one to end carries ``finished`` with the summed usage and every
choice's end, so the publisher writes one ``done`` per job.

With ``best_of`` > n the job runs best_of such sequences and ``translate``
publishes nothing until all have ended; then only the best n come out
(gpuworker/service/best_of.py), as choices 0..n-1.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Optional

from inferq.schemas import SamplingParams

from inferq.gpuworker.service.best_of import Ranking

SEP = "#"


def choice_request_id(job_id: str, index: int) -> str:
    return job_id if index == 0 else f"{job_id}{SEP}{index}"


def choice_params(params: SamplingParams, index: int) -> SamplingParams:
    """Sampling of one choice: one sample, and a seed of its own (seed + index)
    so seeded choices differ from each other yet are reproducible. A sequence of
    a best_of > n job also reports its sampled tokens' logprobs (for the ranking)."""
    update: dict = {"n": 1, "best_of": None}
    if params.seed is not None and index:
        update["seed"] = (params.seed + index) % (2**63)
    if params.ranks_choices:
        update.update(Ranking.sequence_params_update(params) or {})
    return params.model_copy(update=update)


@dataclass
class ChoiceEnd:
    index: int
    finish_reason: str
    completion_tokens: int
    stop_reason: Optional[object] = None


@dataclass
class ChoiceGroup:
    """The engine requests of one job and how far each has got."""

    job_id: str
    n: int
    # Sequences to run (best_of); more than n: only the best n are published.
    sequences: int = 0
    keep_logprobs: bool = False  # the client asked for logprobs (a ranked job may get them anyway)
    live: set[str] = field(default_factory=set)  # request ids in the engine
    waiting: list[int] = field(default_factory=list)  # choice indexes not added yet
    ends: dict[int, ChoiceEnd] = field(default_factory=dict)
    prompt_tokens: int = 0
    cached_tokens: int = 0
    ranking: Optional[Ranking] = None

    def __post_init__(self) -> None:
        self.sequences = max(self.sequences, self.n)
        self.waiting = list(range(1, self.sequences))
        if self.sequences > self.n:
            self.ranking = Ranking(self.sequences, self.n, self.keep_logprobs)

    @classmethod
    def of(cls, job_id: str, params: SamplingParams) -> "ChoiceGroup":
        return cls(job_id, params.n, params.num_sequences, params.logprobs is not None)

    def keep_ended(self, continued: dict) -> bool:
        """Choices an earlier attempt already ended (request migration) stay ended:
        they are not run again. True when choice 0 is among them."""
        for i, c in continued.items():
            if c.finish_reason is not None:
                self.ends[i] = ChoiceEnd(i, c.finish_reason, len(c.token_ids))
                if i in self.waiting:
                    self.waiting.remove(i)
        return 0 in self.ends

    def index_of(self, request_id: str) -> int:
        if request_id == self.job_id:
            return 0
        return int(request_id.rsplit(SEP, 1)[1])

    @property
    def done(self) -> bool:
        return len(self.ends) == self.sequences

    def translate(self, d) -> list:
        """The job-level deltas of engine delta ``d`` of one of this group's requests
        (none while a best_of > n job's sequences are held back)."""
        if self.sequences == 1:
            if d.finished:
                self.live.discard(d.request_id)
                self.ends[0] = ChoiceEnd(0, d.finish_reason, d.num_output_tokens, d.stop_reason)
            return [d]
        i = self.index_of(d.request_id)
        d.request_id, d.index = self.job_id, i
        if i == 0 and d.num_prompt_tokens:
            self.prompt_tokens, self.cached_tokens = d.num_prompt_tokens, d.num_cached_tokens
        if self.ranking is not None:
            self.ranking.hold(i, d)
        if not d.finished:
            return [] if self.ranking is not None else [d]
        self.live.discard(choice_request_id(self.job_id, i))
        self.ends[i] = ChoiceEnd(i, d.finish_reason, d.num_output_tokens, d.stop_reason)
        d.choice_end = d.finish_reason
        if not self.done:
            d.finished = False
            return [] if self.ranking is not None else [d]
        if self.ranking is None:
            return [self._final(d, [self.ends[i] for i in range(self.n)])]
        # best_of: the winners come out now, re-indexed 0..n-1, the last one as the final delta.
        winners = self.ranking.winners()
        out = self.ranking.release(self.job_id, winners, self.ends, self.prompt_tokens or d.num_prompt_tokens,
                                   self.cached_tokens)
        return out[:-1] + [self._final(out[-1], [replace(self.ends[i], index=j) for j, i in enumerate(winners)])]

    def end_waiting(self, reason: str) -> list:
        """Choices never added (aborted before choice 0's prompt was computed)."""
        from inferq.gpuworker.engine.outputs import RequestDelta

        out = []
        for i in self.waiting:
            d = RequestDelta(choice_request_id(self.job_id, i), [], "", finished=True, finish_reason=reason)
            out += self.translate(d)
        self.waiting = []
        return out

    def _final(self, d, ends: list[ChoiceEnd]):
        """``d`` as the job's last delta: choice 0's end, every sequence's tokens in
        the usage (a best_of job bills the losers too, as OpenAI does)."""
        d.finished = True
        d.finish_reason = ends[0].finish_reason
        d.stop_reason = ends[0].stop_reason
        d.num_prompt_tokens = self.prompt_tokens or d.num_prompt_tokens
        d.num_cached_tokens = self.cached_tokens
        d.num_output_tokens = sum(e.completion_tokens for e in self.ends.values())
        d.choices = ends if self.n > 1 else None
        return d
