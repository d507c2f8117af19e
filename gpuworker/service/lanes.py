"""Which lane the intake reads next (schemas/queues.py has what a lane is).

Order of the lanes, for every free slot:
1. priority class: every waiting interactive job before any batch job;
2. fair share among tenant lanes of one class: start-time fair queueing by
   tokens (prompt + max_tokens), each tenant's service divided by its weight,
   so a tenant that floods the queue gets its share and no more; a tenant at
   its concurrency cap on this worker is skipped;
3. prefix affinity: this worker's own lane (sessions it served last) before
   the shared lanes; another worker's lane last, and only for a job that has
   waited there ``steal_after_ms`` (its worker is busy): stealing;
4. partitions: this worker's home partition first, then the others, so an
   idle worker takes work from every partition (no job waits behind a busy
   worker while another is idle).

With one lane (the default deployment) this is a plain blocking XREADGROUP of
the free capacity, as before lanes existed.
"""
from __future__ import annotations

import json
import time
from collections import Counter, defaultdict
from typing import Callable, Optional

import redis

from inferq.schemas import keys
from inferq.schemas.job import job_payload
from inferq.schemas.queues import Lane, lanes_of
from inferq.schemas.text import as_str

from inferq.gpuworker.service.context import WorkerContext

# How often the lane list is re-read (and so how soon a worker sees a lane new
# jobs were routed to, e.g. its own affinity lane): also the longest a single-lane
# read blocks. steal_after_ms must stay well above it.
LANES_REFRESH_S = 0.25


def job_cost(fields: dict) -> float:
    """Tokens a job will cost, estimated from its payload before tokenizing:
    prompt ids, else ~4 characters per token, plus max_tokens."""
    raw = job_payload(fields)
    try:
        job = json.loads(as_str(raw)) if raw is not None else {}
        out = float((job.get("sampling") or {}).get("max_tokens", 16))
        if job.get("prompt_token_ids"):
            return out + len(job["prompt_token_ids"])
        text = job.get("prompt") or "".join(str(m.get("content", "")) for m in job.get("messages") or [])
        return out + len(text) / 4.0
    except (ValueError, TypeError, AttributeError):
        return 1.0


class LaneReader:
    def __init__(self, ctx: WorkerContext, r: "redis.Redis", log, ensure_group: Callable[[Lane], None]):
        self.ctx, self.r, self.log = ctx, r, log
        self.ensure_group = ensure_group
        self.lanes: list[Lane] = []
        self._refreshed = 0.0
        self.home = keys.partition_of(ctx.consumer)
        # Fair share: tokens served per tenant lane / weight, and the virtual
        # time (the start tag last served) a returning tenant catches up to, so
        # a tenant idle for an hour does not come back with an hour of credit.
        self.served: dict[str, float] = defaultdict(float)
        self.vtime = 0.0

    # -- lanes -------------------------------------------------------------------
    def refresh(self, force: bool = False) -> list[Lane]:
        if force or time.monotonic() - self._refreshed >= LANES_REFRESH_S:
            found = lanes_of(self.r, self.ctx.model)
            for lane in set(found) - set(self.lanes):
                self.ensure_group(lane)
            self.lanes = found
            self._refreshed = time.monotonic()
        return self.lanes

    def weight(self, tenant: str) -> float:
        return float(self.ctx.tenant_weights.get(tenant, 1.0)) or 1.0

    def _affinity(self, lane: Lane) -> int:
        return 1 if not lane.owner else (0 if lane.owner == self.ctx.consumer else 2)

    def _key(self, lane: Lane) -> tuple:
        n = keys.partitions()
        # The shared lane ("" tenant: jobs without a tenant) takes part in the fair
        # order too, so callers without a tenant cannot starve the tenants' lanes.
        fair = self.served[lane.tenant]
        return (lane.class_rank, self._affinity(lane), fair, (lane.partition - self.home) % n, lane.tenant, lane.owner)

    def _stealable(self, lane: Lane) -> bool:
        """Another worker's lane: only once its oldest undelivered job has waited
        ``steal_after_ms`` (two reads, made only by a worker with nothing else to do)."""
        last = "0-0"
        try:
            for g in self.r.xinfo_groups(lane.stream):
                if as_str(g.get("name", "")) == self.ctx.group:
                    last = as_str(g.get("last-delivered-id", "0-0"))
        except redis.ResponseError:
            return False  # no stream yet
        nxt = self.r.xrange(lane.stream, min=f"({last}", max="+", count=1)
        if not nxt:
            return False
        born_ms = int(as_str(nxt[0][0]).split("-")[0])
        return time.time() * 1000 - born_ms >= self.ctx.steal_after_ms

    def ordered(self) -> list[Lane]:
        return sorted(self.lanes, key=self._key)

    def charge(self, lane: Lane, entries: list) -> None:
        if not any(ln.tenant for ln in self.lanes):
            return  # no fair-share lanes: nothing to account (and no payload to parse)
        start = max(self.served[lane.tenant], self.vtime)
        self.vtime = start
        self.served[lane.tenant] = start + sum(job_cost(f) for _, f in entries) / self.weight(lane.tenant)

    # -- reads -------------------------------------------------------------------
    def read(self, free: int, extra_interactive: int, running_by_tenant: Counter,
             block_ms: int) -> list[tuple[Lane, list]]:
        """Up to ``free`` new entries (plus ``extra_interactive`` from interactive
        lanes), best lane first; blocks briefly when there is nothing."""
        lanes = self.refresh()
        if len(lanes) == 1 and free > 0:
            got = self._xread(lanes[0], free, min(block_ms, int(LANES_REFRESH_S * 1000)))
            return [(lanes[0], got)] if got else []
        out: list[tuple[Lane, list]] = []
        empty: set[Lane] = set()
        cap = self.ctx.tenant_max_running
        while True:
            room = {keys.INTERACTIVE: free + extra_interactive}
            candidates = [ln for ln in self.ordered() if ln not in empty
                          and room.get(ln.cls, free) > 0
                          and not (cap and ln.tenant and running_by_tenant[ln.tenant] >= cap)]
            if not candidates:
                break
            lane = candidates[0]
            if self._affinity(lane) == 2 and not self._stealable(lane):
                empty.add(lane)
                continue
            # Fair lanes are read one job at a time, so the order is re-decided per job.
            count = 1 if lane.tenant else room.get(lane.cls, free)
            got = self._xread(lane, count, None)
            if not got:
                empty.add(lane)
                continue
            out.append((lane, got))
            self.charge(lane, got)
            running_by_tenant[lane.tenant] += len(got)
            if lane.cls == keys.INTERACTIVE and free < len(got):
                extra_interactive -= len(got) - max(free, 0)
            free -= len(got)
        if not out and (free > 0 or extra_interactive > 0):
            out = self._wait(free, extra_interactive, min(block_ms, self.ctx.idle_poll_ms))
        elif not out:
            time.sleep(self.ctx.idle_poll_ms / 1000)
        return out

    def _wait(self, free: int, extra_interactive: int, block_ms: int) -> list[tuple[Lane, list]]:
        """Nothing anywhere: block a little on the lanes of the home partition this
        worker may take from (its own, the shared ones; interactive only when full),
        one job per lane, then the caller looks at all lanes again. One blocking read
        over several lanes (one slot, so Cluster takes it) lets Redis hand each new
        job to the next waiting worker, instead of the first sweep taking a burst."""
        wait = [ln for ln in self.ordered() if self._affinity(ln) < 2 and ln.partition == self.home
                and (free > 0 or ln.cls == keys.INTERACTIVE)][: max(1, free + extra_interactive)]
        if not wait:
            time.sleep(block_ms / 1000)
            return []
        resp = self.r.xreadgroup(self.ctx.group, self.ctx.consumer, {ln.stream: ">" for ln in wait}, count=1,
                                 block=block_ms)
        by_stream = {ln.stream: ln for ln in wait}
        out = []
        for stream, entries in resp or []:
            lane = by_stream[as_str(stream)]
            if entries:
                self.charge(lane, entries)
                out.append((lane, entries))
        return out

    def _xread(self, lane: Lane, count: int, block: Optional[int]) -> list:
        resp = self.r.xreadgroup(self.ctx.group, self.ctx.consumer, {lane.stream: ">"}, count=count, block=block)
        return resp[0][1] if resp else []
