"""best_of > n: a job's sequences are held back and only the best n are published.

Every sequence's output (text, token ids, logprobs) is kept here until all have
ended; then the n with the highest cumulative logprob of their sampled tokens
win (vLLM's ranking; ties go to the lower sequence index), re-indexed 0..n-1 in
that order. Nothing of a losing sequence reaches the reply stream, so a client
never shows text that is not in the answer; the price is that such a job's
output arrives all at once at its end (the gateway refuses ``stream`` with
best_of > n, as OpenAI does).

The sampled token's logprob comes from the engine's own logprobs: a sequence of a
ranked job asks for ``logprobs=0`` (the sampled token only, no top-N) when the
client did not ask for logprobs (ranked by the model's raw logprobs), and those
are dropped before publishing; a client that asked gets its own kind (raw or
processed), and the ranking uses those.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from inferq.gpuworker.engine.outputs import RequestDelta


@dataclass
class Held:
    """One sequence's output so far."""

    text: list[str] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[dict[int, float]] = field(default_factory=list)
    cumulative_logprob: float = 0.0


class Ranking:
    def __init__(self, sequences: int, n: int, keep_logprobs: bool):
        self.n = n
        self.keep_logprobs = keep_logprobs  # the client asked for them
        self.held = [Held() for _ in range(sequences)]
        self.prompt_logprobs = None  # sequence 0's, sent with the first winner

    def hold(self, i: int, d: RequestDelta) -> None:
        h = self.held[i]
        h.text.append(d.new_text)
        h.token_ids.extend(d.new_token_ids)
        if d.logprobs:
            for token, lp in zip(d.new_token_ids, d.logprobs):
                h.cumulative_logprob += lp.get(token, 0.0)
            if self.keep_logprobs:
                h.logprobs.extend(d.logprobs)
        if i == 0 and d.prompt_logprobs is not None:
            self.prompt_logprobs = d.prompt_logprobs

    def winners(self) -> list[int]:
        """Sequence indexes of the best n, best first."""
        order = sorted(range(len(self.held)), key=lambda i: (-self.held[i].cumulative_logprob, i))
        return order[: self.n]

    def release(self, job_id: str, winners: list[int], ends: dict, prompt_tokens: int,
                cached_tokens: int) -> list[RequestDelta]:
        """One delta per winner (choice j = the j-th best), each with its whole output
        and its end; the caller turns the last into the job's final delta."""
        out = []
        for j, i in enumerate(winners):
            h, end = self.held[i], ends[i]
            out.append(RequestDelta(
                job_id, h.token_ids, "".join(h.text),
                logprobs=(h.logprobs if self.keep_logprobs else None),
                num_prompt_tokens=prompt_tokens, num_output_tokens=end.completion_tokens,
                num_cached_tokens=cached_tokens,
                prompt_logprobs=self.prompt_logprobs if j == 0 else None,
                index=j, choice_end=end.finish_reason, stop_reason=end.stop_reason))
        return out

    @staticmethod
    def sequence_params_update(params) -> Optional[dict]:
        """What a ranked job's sequence changes in its params to get its sampled
        tokens' logprobs: ``logprobs=0`` in the default raw mode (which samples on
        the fast path, as the same sequence without logprobs does) unless the client
        asked for logprobs; greedy sequences are all the same text, so need none."""
        if params.logprobs is None and not params.greedy:
            return {"logprobs": 0, "logprobs_mode": "raw_logprobs"}
        return None
