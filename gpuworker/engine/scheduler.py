"""vLLM V1-style scheduler: one token budget per step, no prefill/decode phases.

Each step, running requests are served first (a decode is one token, a
continuing prefill is its next chunk), then waiting requests are admitted
while budget, sequence slots and KV blocks last. A prompt longer than the
remaining budget is cut into chunks (chunked prefill), so decodes never wait
behind a long prompt. When blocks run out, the least important running request
is preempted: its blocks are freed and it is recomputed later.

Under the priority policy a waiting request may also preempt running ones: when
the best waiting request cannot be admitted (``max_num_seqs`` reached or no
blocks) and running requests of a strictly worse priority would make room, the
worst of them are preempted (recompute), worst first, until it fits. Requests
of equal or better priority are never preempted for it, and nothing is
preempted unless freeing every eligible victim would really make it fit.
"""
from __future__ import annotations

import heapq
import itertools
from collections import deque
from dataclasses import dataclass, field
from typing import Iterable, Optional

from inferq.gpuworker.engine.kv_cache_manager import KVCacheManager
from inferq.gpuworker.engine.request import Request, RequestStatus


class ScheduledRequest:
    """One request's share of a step. A plain slotted class: the scheduler makes
    one per running request per step (256 at batch 256)."""

    __slots__ = ("request", "num_new_tokens", "num_computed_before", "samples", "num_spec")

    def __init__(self, request: Request, num_new_tokens: int, num_computed_before: int, num_spec: int = 0):
        self.request = request
        # Known tokens plus, for a speculating decode, its proposed ones (the last num_spec).
        self.num_new_tokens = num_new_tokens
        # Tokens computed before this step (prefix hits included).
        self.num_computed_before = num_computed_before
        # Reaches the end of its known tokens this step, so it samples one more
        # (a speculating one samples at each proposed position too).
        self.samples = num_computed_before + num_new_tokens - num_spec == len(request.all_token_ids)
        self.num_spec = num_spec

    def __repr__(self) -> str:
        return f"ScheduledRequest({self.request.request_id!r}, new={self.num_new_tokens}, before={self.num_computed_before})"


@dataclass
class SchedulerOutput:
    scheduled: list[ScheduledRequest] = field(default_factory=list)
    preempted: list[Request] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return sum(s.num_new_tokens for s in self.scheduled)

    def __bool__(self) -> bool:
        return bool(self.scheduled)


class WaitingQueue:
    """FCFS: a deque, preempted requests go back to the front.
    Priority: a heap on (priority, arrival); preempted requests keep their key."""

    def __init__(self, policy: str):
        if policy not in ("fcfs", "priority"):
            raise ValueError(f"unknown scheduling policy {policy!r}; choose 'fcfs' or 'priority'")
        self.policy = policy
        self._deque: deque[Request] = deque()
        self._heap: list[tuple] = []
        self._tie = itertools.count()

    def add(self, req: Request) -> None:
        if self.policy == "fcfs":
            self._deque.append(req)
        else:
            heapq.heappush(self._heap, (req.sort_key(), next(self._tie), req))

    def add_front(self, req: Request) -> None:
        if self.policy == "fcfs":
            self._deque.appendleft(req)
        else:
            self.add(req)

    def peek(self) -> Request:
        return self._deque[0] if self.policy == "fcfs" else self._heap[0][2]

    def pop(self) -> Request:
        return self._deque.popleft() if self.policy == "fcfs" else heapq.heappop(self._heap)[2]

    def remove(self, req: Request) -> bool:
        if self.policy == "fcfs":
            try:
                self._deque.remove(req)
                return True
            except ValueError:
                return False
        for i, entry in enumerate(self._heap):
            if entry[2] is req:
                self._heap.pop(i)
                heapq.heapify(self._heap)
                return True
        return False

    def __iter__(self) -> Iterable[Request]:
        return iter(self._deque) if self.policy == "fcfs" else (e[2] for e in self._heap)

    def __len__(self) -> int:
        return len(self._deque) if self.policy == "fcfs" else len(self._heap)


class Scheduler:
    def __init__(
        self,
        kv: KVCacheManager,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        policy: str = "fcfs",
        enable_chunked_prefill: bool = True,
    ):
        self.kv = kv
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.enable_chunked_prefill = enable_chunked_prefill
        self.policy = policy
        self.waiting = WaitingQueue(policy)
        self.running: list[Request] = []
        self.num_preemptions = 0  # all recompute preemptions
        self.num_priority_preemptions = 0  # of those: made by a waiting request of better priority

    def add(self, req: Request) -> None:
        self.waiting.add(req)

    # -- the step plan --------------------------------------------------------
    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        budget = self.max_num_batched_tokens
        scheduled: dict[str, ScheduledRequest] = {}

        # 1. Running requests, in order: decodes and continuing prefill chunks.
        # (Runs once per running request per step: locals instead of attribute lookups.)
        running, kv, chunked, RUNNING = self.running, self.kv, self.enable_chunked_prefill, RequestStatus.RUNNING
        i = 0
        while i < len(running) and budget > 0:
            req = running[i]
            computed = req.num_computed_tokens
            left = len(req.all_token_ids) - computed
            num_new = left if left < budget else budget
            if not chunked and num_new < left:
                i += 1
                continue
            spec = req.spec_token_ids
            if spec:
                # Proposed tokens count against the budget like any other: keep what fits.
                if left + len(spec) > budget:
                    spec = req.spec_token_ids = spec[: max(0, budget - left)]
                num_new += len(spec)
            while not kv.allocate_slots(req, num_new):
                victim = self._pick_victim()
                if running.index(victim) < i:
                    i -= 1  # an earlier (already scheduled) request leaves the list
                budget += self._preempt(victim, scheduled, out)
                if victim is req:
                    break
            if req.status is not RUNNING:
                continue  # req preempted itself; running[i] is now the next one
            scheduled[req.request_id] = ScheduledRequest(req, num_new, computed, len(spec) if spec else 0)
            budget -= num_new
            i += 1

        # 2. Waiting requests, only if no running request had to be preempted
        #    for blocks this step (under the priority policy a waiting request
        #    may still preempt worse-priority running ones to get in).
        kv_preempted = bool(out.preempted)
        while not kv_preempted and len(self.waiting) and budget > 0:
            req = self.waiting.peek()
            if req.status is RequestStatus.PREEMPTED and req in out.preempted:
                # Evicted in this very step for a better request: everything still
                # waiting sorts after it, so nobody else gets in this step either.
                break
            if len(self.running) >= self.max_num_seqs and not self._may_preempt_for(req):
                break
            hit_blocks, num_hit = [], 0
            if req.num_computed_tokens == 0:
                hit_blocks, num_hit = self.kv.get_computed_blocks(req)
            remaining = req.num_tokens - num_hit
            num_new = min(remaining, budget)
            if not self.enable_chunked_prefill and num_new < remaining:
                break  # whole prompts only: wait for a step with room
            refund = self._make_room(req, num_new, hit_blocks, scheduled, out)
            if refund is None:
                break  # out of seats or blocks: admit nobody else this step
            budget += refund  # victims scheduled earlier in this step give their tokens back
            self.waiting.pop()
            req.num_computed_tokens = num_hit
            if req.num_cached_tokens < 0:
                req.num_cached_tokens = num_hit
            req.status = RequestStatus.RUNNING
            self.running.append(req)
            scheduled[req.request_id] = ScheduledRequest(req, num_new, num_hit)
            budget -= num_new

        out.scheduled = list(scheduled.values())
        # vLLM V1 advances progress at schedule time: the step will compute them.
        for s in out.scheduled:
            s.request.num_computed_tokens += s.num_new_tokens
        return out

    # -- priority preemption of running requests by a waiting one ---------------
    def _may_preempt_for(self, req: Request) -> bool:
        """Cheap pre-check: is there any running request ``req`` could evict?"""
        return self.policy == "priority" and any(r.priority > req.priority for r in self.running)

    def _make_room(self, req: Request, num_new: int, hit_blocks: list, scheduled: dict,
                   out: SchedulerOutput) -> Optional[int]:
        """Get ``req`` a seat and blocks for ``num_new`` tokens, preempting running
        requests of strictly worse priority (priority policy only) when needed.

        Victims go worst first (largest ``sort_key``: worst priority, then latest
        arrival). Nothing is preempted unless evicting every eligible victim would
        make ``req`` fit, so a preemption is never wasted. Returns None when
        ``req`` cannot get in, else the token budget the victims gave back
        (victims already scheduled earlier in this step), once the slots are
        allocated."""
        if len(self.running) < self.max_num_seqs and self.kv.allocate_slots(req, num_new, hit_blocks):
            return 0
        if self.policy != "priority":
            return None
        victims = sorted((r for r in self.running if r.priority > req.priority),
                         key=Request.sort_key, reverse=True)
        if not victims:
            return None
        if len(self.running) - len(victims) >= self.max_num_seqs:
            return None  # even evicting all of them leaves no seat
        if not self.kv.can_allocate_after_freeing(req, num_new, hit_blocks, victims):
            return None  # even evicting all of them leaves too few blocks
        refund = 0
        for victim in victims:
            refund += self._preempt(victim, scheduled, out, reason="priority")
            if len(self.running) < self.max_num_seqs and self.kv.allocate_slots(req, num_new, hit_blocks):
                return refund
        raise AssertionError(f"preempted every eligible victim and {req.request_id} still does not fit")

    def _pick_victim(self) -> Request:
        if self.policy == "priority":
            return max(self.running, key=Request.sort_key)
        return self.running[-1]  # FCFS: the latest arrival

    def _preempt(self, victim: Request, scheduled: dict, out: SchedulerOutput, reason: str = "kv") -> int:
        """Free the victim's blocks and requeue it; returns budget given back.

        ``reason``: "kv" (a running request needed blocks) or "priority" (a
        waiting request of better priority needed a seat or blocks)."""
        self.running.remove(victim)
        self.kv.free(victim)
        refund = 0
        s = scheduled.pop(victim.request_id, None)
        if s is not None:
            refund = s.num_new_tokens
        victim.status = RequestStatus.PREEMPTED
        victim.num_computed_tokens = 0
        victim.spec_token_ids = []
        victim.num_preemptions += 1
        self.num_preemptions += 1
        if reason == "priority":
            self.num_priority_preemptions += 1
        self.waiting.add_front(victim)
        out.preempted.append(victim)
        return refund

    # -- removal --------------------------------------------------------------
    def finish(self, req: Request, reason: str) -> None:
        """Remove a request wherever it is and free its blocks at once."""
        if req.status is RequestStatus.RUNNING:
            self.running.remove(req)
        elif req.status in (RequestStatus.WAITING, RequestStatus.PREEMPTED):
            self.waiting.remove(req)
        self.kv.free(req)
        req.status = RequestStatus.FINISHED
        req.finish_reason = reason

    @property
    def num_running(self) -> int:
        return len(self.running)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    def has_unfinished(self) -> bool:
        return bool(self.running) or bool(len(self.waiting))

    def live_request_ids(self) -> set[str]:
        return {r.request_id for r in self.running} | {r.request_id for r in self.waiting}
