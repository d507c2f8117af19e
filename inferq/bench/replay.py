"""Replay a timed workload through the real engine, stepped by hand.

Requests enter when their arrival time has passed on the wall clock (the
driver sleeps while the engine is idle). Every step's new tokens are
timestamped per request, and the KV blocks held by requests are sampled after
every step, so latency and memory come from the same trace.

``static=True`` is the static-batching driver: a new batch (whatever has
arrived, up to ``static_batch``) is admitted only once the previous batch has
completely finished.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Optional

from inferq.bench.mixed_workload import TimedRequest
from inferq.schemas import SamplingParams


@dataclass
class RequestTrace:
    arrival_s: float
    prompt_len: int
    output_len: int
    token_times: list[float] = field(default_factory=list)  # one per step that produced tokens
    num_tokens: int = 0

    @property
    def ttft(self) -> Optional[float]:
        return self.token_times[0] - self.arrival_s if self.token_times else None

    @property
    def itls(self) -> list[float]:
        t = self.token_times
        return [b - a for a, b in zip(t, t[1:])]


@dataclass
class KVSample:
    """Requests holding blocks after one step, and what they hold."""

    num_requests: int
    tokens: int  # tokens whose KV is in the cache
    paged_slots: int  # allocated blocks x block size
    final_len_slots: int  # sum of (prompt + max_tokens) of those requests
    # (contiguous reservation at max_model_len = num_requests x max_model_len)


@dataclass
class Trace:
    requests: dict[str, RequestTrace]
    kv: list[KVSample]
    wall_s: float
    steps: int
    step_tokens: list[int]  # tokens scheduled in each step
    step_seconds: list[float] = field(default_factory=list)  # how long each step took
    step_seqs: list[int] = field(default_factory=list)  # sequences in each step


def replay(engine, workload: list[TimedRequest], *, static: bool = False, static_batch: int = 8,
           on_request_done: Optional[Callable[[], None]] = None) -> Trace:
    if static and static_batch < 1:
        raise ValueError("static batch size must be at least 1")
    todo = sorted(workload, key=lambda r: r.arrival_s)
    traces = {r.request_id: RequestTrace(r.arrival_s, len(r.prompt_token_ids), r.output_len) for r in todo}
    final_len = {r.request_id: r.final_len for r in todo}
    kv_samples: list[KVSample] = []
    step_tokens: list[int] = []
    step_seconds: list[float] = []
    step_seqs: list[int] = []
    bs = engine.kv.block_size
    nxt = 0
    # Observe (not change) each step's plan: how many tokens it computes.
    plain_schedule = engine.scheduler.schedule
    last_scheduled = [0, 0]  # tokens, sequences

    def observed_schedule():
        out = plain_schedule()
        last_scheduled[:] = [sum(s.num_new_tokens for s in out.scheduled), len(out.scheduled)]
        return out

    engine.scheduler.schedule = observed_schedule
    start = time.perf_counter()

    def add(r: TimedRequest) -> None:
        params = SamplingParams(max_tokens=r.output_len, temperature=0.0, ignore_eos=True)
        engine.add_request(r.request_id, r.prompt_token_ids, params)

    try:
        while nxt < len(todo) or engine.has_unfinished():
            now = time.perf_counter() - start
            if static:
                if not engine.has_unfinished():
                    batch_end = nxt
                    while batch_end < len(todo) and batch_end - nxt < static_batch and todo[batch_end].arrival_s <= now:
                        batch_end += 1
                    for r in todo[nxt:batch_end]:
                        add(r)
                    nxt = batch_end
            else:
                while nxt < len(todo) and todo[nxt].arrival_s <= now:
                    add(todo[nxt])
                    nxt += 1
            if not engine.has_unfinished():
                time.sleep(max(0.0, todo[nxt].arrival_s - (time.perf_counter() - start)))
                continue

            last_scheduled[:] = [0, 0]
            t_step = time.perf_counter()
            deltas = engine.step()
            t = time.perf_counter() - start
            step_seconds.append(t + start - t_step)
            step_tokens.append(last_scheduled[0])
            step_seqs.append(last_scheduled[1])
            for d in deltas:
                tr = traces[d.request_id]
                if d.new_token_ids:
                    tr.token_times.append(t)
                    tr.num_tokens += len(d.new_token_ids)
                if d.finished and on_request_done is not None:
                    on_request_done()
            held = engine.kv.req_blocks
            if held:
                kv_samples.append(KVSample(
                    num_requests=len(held),
                    tokens=sum(min(engine.requests[rid].num_computed_tokens, engine.requests[rid].num_tokens)
                               for rid in held if rid in engine.requests),
                    paged_slots=sum(len(b) for b in held.values()) * bs,
                    final_len_slots=sum(final_len[rid] for rid in held),
                ))
    finally:
        del engine.scheduler.schedule  # back to the class's own method
    return Trace(traces, kv_samples, time.perf_counter() - start, len(step_tokens), step_tokens, step_seconds, step_seqs)
