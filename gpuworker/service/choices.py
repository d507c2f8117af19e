"""One job's choices (sampling.n > 1) as sibling engine requests.

Choice 0 runs under the job's own id, choice i under ``"<job>#<i>"``. Choices
1..n-1 are added only once choice 0's prompt is computed: its full blocks are
then in the prefix cache, so the siblings reuse the prompt's KV blocks instead
of computing (and holding) their own copies. ``translate`` turns the engine's
per-request deltas into the job's: each tagged with its choice ``index``; a
choice that ends while others run becomes a delta with ``choice_end`` set, and
the last one to end carries ``finished`` with the summed usage and every
choice's end, so the publisher writes one ``done`` per job.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from schemas import SamplingParams

SEP = "#"


def choice_request_id(job_id: str, index: int) -> str:
    return job_id if index == 0 else f"{job_id}{SEP}{index}"


def choice_params(params: SamplingParams, index: int) -> SamplingParams:
    """Sampling of one choice: one sample, and a seed of its own (seed + index)
    so seeded choices differ from each other yet are reproducible."""
    update: dict = {"n": 1}
    if params.seed is not None and index:
        update["seed"] = (params.seed + index) % (2**63)
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
    live: set[str] = field(default_factory=set)  # request ids in the engine
    waiting: list[int] = field(default_factory=list)  # choice indexes not added yet
    ends: dict[int, ChoiceEnd] = field(default_factory=dict)
    prompt_tokens: int = 0
    cached_tokens: int = 0

    def __post_init__(self) -> None:
        self.waiting = list(range(1, self.n))

    def index_of(self, request_id: str) -> int:
        if request_id == self.job_id:
            return 0
        return int(request_id.rsplit(SEP, 1)[1])

    @property
    def done(self) -> bool:
        return len(self.ends) == self.n

    def translate(self, d):
        """The job-level form of engine delta ``d`` of one of this group's requests."""
        if self.n == 1:
            if d.finished:
                self.live.discard(d.request_id)
                self.ends[0] = ChoiceEnd(0, d.finish_reason, d.num_output_tokens, d.stop_reason)
            return d
        i = self.index_of(d.request_id)
        d.request_id, d.index = self.job_id, i
        if i == 0 and d.num_prompt_tokens:
            self.prompt_tokens, self.cached_tokens = d.num_prompt_tokens, d.num_cached_tokens
        if not d.finished:
            return d
        self.live.discard(choice_request_id(self.job_id, i))
        self.ends[i] = ChoiceEnd(i, d.finish_reason, d.num_output_tokens, d.stop_reason)
        d.choice_end = d.finish_reason
        if not self.done:
            d.finished = False
            return d
        return self._final(d)

    def end_waiting(self, reason: str) -> list:
        """Choices never added (aborted before choice 0's prompt was computed)."""
        from gpuworker.engine.outputs import RequestDelta

        out = []
        for i in self.waiting:
            d = RequestDelta(choice_request_id(self.job_id, i), [], "", finished=True, finish_reason=reason)
            out.append(self.translate(d))
        self.waiting = []
        return out

    def _final(self, d):
        first = self.ends[0]
        d.finished = True
        d.finish_reason = first.finish_reason
        d.stop_reason = first.stop_reason
        d.num_prompt_tokens = self.prompt_tokens or d.num_prompt_tokens
        d.num_cached_tokens = self.cached_tokens
        d.num_output_tokens = sum(e.completion_tokens for e in self.ends.values())
        d.choices = [self.ends[i] for i in range(self.n)]
        return d
