"""Which requests speculate this step, and what speculation has done so far.

Adaptive in two ways, so that it never costs more than a few percent:

* per request: the acceptance of its recent verifications (accepted / proposed,
  an exponential average) is kept; below ``min_acceptance`` the request stops
  proposing for ``cooldown_tokens`` output tokens, then tries again (text that
  copies nothing may start copying later: a list, a quote, a JSON echo);
* per step: with more than ``max_batch`` running requests nobody proposes. A
  decode step there is compute-bound, and k extra rows per request cost about
  k tokens each, where at small batch they ride along with the weight reads.

Structured outputs speculate: a proposal is cut to the prefix the request's
grammar accepts (``validate_tokens``), and the mask of every verified position is
filled with the proposals before it consumed (llguidance's draft-token fill, then
the matcher is as it was; the accepted tokens are consumed as they are emitted).
Requests with logit_bias, min_tokens or penalties do not speculate: those depend
on the output so far, which at a proposed position includes the proposals.
"""
from __future__ import annotations

from dataclasses import dataclass

from inferq.gpuworker.engine.request import Request, RequestStatus
from inferq.gpuworker.engine.speculative.config import SpeculativeConfig
from inferq.gpuworker.engine.speculative.proposer import Proposer

_EMA = 0.3  # weight of the newest verification in a request's acceptance average


@dataclass
class SpecStats:
    """Cumulative counters (vLLM: spec_decode_num_drafts / num_draft_tokens / num_accepted_tokens)."""

    num_drafts: int = 0  # verifications: one request's proposal checked in one step
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    num_steps_off_for_batch: int = 0  # steps where the batch was too large to speculate
    num_cooldowns: int = 0  # times a request stopped proposing for low acceptance

    @property
    def acceptance_rate(self) -> float:
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else 0.0


class _RequestSpec:
    __slots__ = ("acceptance", "verifications", "resume_at")

    def __init__(self):
        self.acceptance = 1.0
        self.verifications = 0
        self.resume_at = 0  # output length from which it may propose again


class SpecDecoder:
    def __init__(self, config: SpeculativeConfig, proposer: Proposer, max_model_len: int):
        self.config = config
        self.proposer = proposer
        self.max_model_len = max_model_len
        self.stats = SpecStats()
        self._state: dict[str, _RequestSpec] = {}
        self._proposed: list[Request] = []  # requests carrying a proposal this step

    @staticmethod
    def eligible(req: Request) -> bool:
        p = req.params
        # A pooling request (embeddings) samples nothing: there is nothing to verify.
        return not p.uses_penalties and not p.logit_bias and not p.min_tokens and req.pooling is None

    def propose(self, running: list[Request]) -> None:
        """Set ``spec_token_ids`` on the decoding requests that speculate this step."""
        if len(running) > self.config.max_batch:
            if running:
                self.stats.num_steps_off_for_batch += 1
            return
        picked, limits = [], []
        k, max_len = self.config.k, self.max_model_len
        for req in running:
            if req.status is not RequestStatus.RUNNING or req.num_computed_tokens != len(req.all_token_ids) - 1:
                continue  # still in its prompt (or not caught up): nothing to verify against
            if not self.eligible(req):
                continue
            state = self._state.get(req.request_id)
            if state is None:
                state = self._state[req.request_id] = _RequestSpec()
            n_out = len(req.output_token_ids)
            if n_out < state.resume_at:
                continue
            limit = min(k, req.max_tokens - n_out - 1, max_len - len(req.all_token_ids) - 1)
            if limit > 0:
                picked.append(req)
                limits.append(limit)
        if not picked:
            return
        for req, draft in zip(picked, self.proposer.propose(picked, limits)):
            if draft and req.matcher is not None:
                draft = draft[: req.matcher.validate_tokens(draft)]  # what the grammar would mask anyway
            elif draft and req.reasoning_gate is not None:  # the grammar waits for the reasoning's end
                draft = draft[: req.reasoning_gate.draft_limit(req.output_token_ids, draft)]
            if draft:
                req.spec_token_ids = draft
                self._proposed.append(req)

    def end_step(self, kv=None) -> None:
        """Proposals live for one step (scheduled or not: the next step proposes afresh).
        With ``kv``: blocks a proposer allocated for proposals that did not run go back."""
        for req in self._proposed:
            req.spec_token_ids = []
            if kv is not None and req.status is RequestStatus.RUNNING:
                kv.free_surplus(req)
        self._proposed.clear()

    def verified(self, req: Request, num_proposed: int, num_accepted: int) -> None:
        st = self.stats
        st.num_drafts += 1
        st.num_draft_tokens += num_proposed
        st.num_accepted_tokens += num_accepted
        self.proposer.accepted(req, num_proposed, num_accepted)
        state = self._state.get(req.request_id)
        if state is None:
            return
        state.verifications += 1
        state.acceptance = (1 - _EMA) * state.acceptance + _EMA * (num_accepted / num_proposed)
        if state.verifications >= 2 and state.acceptance < self.config.min_acceptance:
            st.num_cooldowns += 1
            state.resume_at = len(req.output_token_ids) + self.config.cooldown_tokens
            state.acceptance, state.verifications = self.config.min_acceptance, 0  # a fresh start after

    def finished(self, request_id: str) -> None:
        self._state.pop(request_id, None)
        self.proposer.finished(request_id)
