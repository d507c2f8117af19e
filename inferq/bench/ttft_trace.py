"""Where a job's time to first token goes, measured in a running worker.

  # a worker with per-job and per-step timestamps (wall clock), written to TRACE on exit
  inferq bench ttft-trace worker --trace-out TRACE.json -- --model FOLDER ... (worker flags)
  # then, after `inferq bench serve --backend redis --result-file RESULT.json` against it:
  inferq bench ttft-trace report TRACE.json RESULT.json
  # step durations as any client sees them (inferq or `vllm serve` result files):
  inferq bench ttft-trace steps RESULT.json [RESULT.json ...]

Measurement only: ``worker`` wraps a few methods of the worker's threads and the
engine (no change to what they do) and runs the normal worker CLI. Per job it
records: submit (the SDK's ``created_at``), XREADGROUP returned, admission
(claim round trip) done, ``engine.add_request``, start of the first step that
schedules it, end of the step that samples its first token, and the publisher's
round trip that writes that token. Per step: its wall time, rows, prompt rows,
and how much of it the engine thread spent on a CPU, waiting for a core, or
blocked (the GIL, locks), from /proc/thread-self/schedstat.
"""
from __future__ import annotations

import argparse
import atexit
import bisect
import json
import statistics as st
import sys
import threading
import time
from pathlib import Path


# -- the traced worker ---------------------------------------------------------
def _schedstat() -> tuple[float, float]:
    """(seconds on a CPU, seconds runnable but waiting for a core) of this thread."""
    try:
        with open("/proc/thread-self/schedstat") as f:
            on_cpu, waiting = f.read().split()[:2]
        return int(on_cpu) / 1e9, int(waiting) / 1e9
    except OSError:  # not Linux: the split is left out
        return 0.0, 0.0


def install(trace_out: str) -> None:
    """Wrap the points of a job's path; dump what they saw at exit."""
    import inferq.gpuworker.engine.llm_engine as eng_mod
    import inferq.gpuworker.engine.scheduler as sched_mod
    import inferq.gpuworker.service.engine_loop as loop_mod
    import inferq.gpuworker.service.intake as intake_mod
    import inferq.gpuworker.service.lanes as lanes_mod
    import inferq.gpuworker.service.publisher as pub_mod

    now = time.time
    jobs: dict[str, dict] = {}  # job id or "entry:<stream entry id>" -> {point: wall time}
    steps: list = []  # (t0, t1, rows, prompt rows, tokens, first-scheduled ids, on-CPU s, waiting-for-core s)
    lock = threading.Lock()

    def rec(key: str) -> dict:
        with lock:
            return jobs.setdefault(key, {})

    def entry(eid) -> dict:
        return rec("entry:" + (eid.decode() if isinstance(eid, bytes) else str(eid)))

    xread = lanes_mod.LaneReader._xread

    def _xread(self, lane, count, block):
        got = xread(self, lane, count, block)
        t = now()
        for eid, _ in got:
            entry(eid).setdefault("read", t)
        return got

    admit = intake_mod.Intake.admit

    def _admit(self, lane, entries, suspects=None):
        t = now()
        admit(self, lane, entries, suspects)
        t2 = now()
        for eid, _ in entries:
            e = entry(eid)
            e.setdefault("admit0", t)
            e.setdefault("admit1", t2)

    add = loop_mod.EngineLoop._add

    def _add(self, state):
        j = rec(state.id)
        j.update(entry=state.entry_id, created=state.job.created_at, add=now())
        return add(self, state)

    schedule = sched_mod.Scheduler.schedule

    def _schedule(self):
        out = self._trace_last = schedule(self)
        return out

    step = eng_mod.LLMEngine.step

    def _step(self):
        c0, q0 = _schedstat()
        t0 = now()
        self.scheduler._trace_last = None
        deltas = step(self)
        t1 = now()
        c1, q1 = _schedstat()
        out = self.scheduler._trace_last
        if out:
            first = []
            for s in out.scheduled:
                j = rec(s.request.request_id)
                if "sched0" not in j:
                    j["sched0"] = t0
                    first.append(s.request.request_id)
            prompt_rows = sum(1 for s in out.scheduled if s.num_computed_before < len(s.request.prompt_token_ids))
            steps.append((t0, t1, len(out.scheduled), prompt_rows, out.num_tokens, first, c1 - c0, q1 - q0))
        for d in deltas:
            if d.new_token_ids:
                rec(d.request_id).setdefault("token", t1)
        return deltas

    flush = pub_mod.Publisher.flush

    def _flush(self, items):
        t = now()
        firsts = [d.request_id for it in items if isinstance(it, pub_mod.StepOutput)
                  for d in it.deltas if d.new_token_ids and "pub0" not in rec(d.request_id)]
        for rid in firsts:
            rec(rid)["pub0"] = t
        flush(self, items)
        t2 = now()
        for rid in firsts:
            rec(rid)["pub1"] = t2

    lanes_mod.LaneReader._xread = _xread
    intake_mod.Intake.admit = _admit
    loop_mod.EngineLoop._add = _add
    sched_mod.Scheduler.schedule = _schedule
    eng_mod.LLMEngine.step = _step
    pub_mod.Publisher.flush = _flush

    def dump() -> None:
        with lock:
            Path(trace_out).write_text(json.dumps({"jobs": jobs, "steps": steps}))

    atexit.register(dump)


# -- reports ---------------------------------------------------------------------
# A job's path, in order; each phase is the time from the point before.
POINTS = (("read", "submit -> XREADGROUP returned"), ("admit1", "admission (claim round trip)"),
          ("add", "wait for the step in progress (engine.add_request)"), ("sched0", "add -> its first step starts"),
          ("token", "its first step (prefill + the running decodes)"), ("pub0", "step end -> publisher picks it up"),
          ("client", "publisher's round trip -> the client has it"))


def job_rows(trace: dict, result: dict) -> list[dict]:
    """Per measured request: seconds since submit at each point. Requests are matched
    to jobs by submit order (the warm-up jobs come first and are left out)."""
    raw = trace["jobs"]
    jobs = []
    for v in raw.values():
        if "created" in v:
            jobs.append({**raw.get("entry:" + str(v["entry"]), {}), **v})
    jobs.sort(key=lambda v: v["created"])
    reqs = sorted(result["requests"], key=lambda r: r["sent_at"])
    rows = []
    for v, r in zip(jobs[len(jobs) - len(reqs):], reqs):
        if not r["chunk_times"] or any(p not in v for p, _ in POINTS[:-1]):
            continue
        row = {p: v[p] - v["created"] for p, _ in POINTS[:-1]}
        row["client"] = r["chunk_times"][0] - r["sent_at"]
        rows.append(row)
    return rows


def lost_steps(trace: dict) -> int:
    """Steps that started after a job was admitted but before the engine took it:
    each is a step the job could have been in and was not."""
    starts = [s[0] for s in trace["steps"]]
    n = 0
    for v in trace["jobs"].values():
        if "add" in v:
            e = trace["jobs"].get("entry:" + str(v["entry"]), {})
            if "admit1" in e:
                n += bisect.bisect_left(starts, v["add"]) - bisect.bisect_left(starts, e["admit1"])
    return n


def report(trace: dict, result: dict) -> str:
    rows = job_rows(trace, result)
    out = [f"{len(rows)} requests; ms per phase (median / mean):"]
    prev = None
    for p, label in POINTS:
        seg = [r[p] - (r[prev] if prev else 0.0) for r in rows]
        out.append(f"  {label:<52} {1000 * st.median(seg):8.1f} {1000 * st.mean(seg):8.1f}")
        prev = p
    ttft = [r["client"] for r in rows]
    out.append(f"  {'TTFT (client)':<52} {1000 * st.median(ttft):8.1f} {1000 * st.mean(ttft):8.1f}")
    out.append(f"steps a job could have joined and did not: {lost_steps(trace)}")
    steps = trace["steps"]
    for name, sel in (("steps with a prompt", [s for s in steps if s[3]]), ("decode-only steps", [s for s in steps if not s[3]])):
        if not sel:
            continue
        wall = sum(s[1] - s[0] for s in sel)
        cpu, wait = sum(s[6] for s in sel), sum(s[7] for s in sel)
        out.append(f"{name}: {len(sel)}, median {1000 * st.median([s[1] - s[0] for s in sel]):.0f} ms; engine thread "
                   f"on a CPU {100 * cpu / wall:.0f}%, waiting for a core {100 * wait / wall:.0f}%, "
                   f"blocked (GIL, locks) {100 * (wall - cpu - wait) / wall:.0f}%")
    return "\n".join(out)


def client_steps(result: dict) -> str:
    """Step durations as the client sees them, for any server: the gap between two
    tokens of a running request, split by whether some request's first token came
    at the same moment (a step that ran a prompt) or not (a decode-only step)."""
    reqs = [r for r in result["requests"] if r["chunk_times"]]
    firsts = sorted(r["chunk_times"][0] for r in reqs)
    mixed, decode = [], []
    for r in reqs:
        c = r["chunk_times"]
        for a, b in zip(c, c[1:]):
            i = bisect.bisect_left(firsts, b - 0.03)
            near = i < len(firsts) and abs(firsts[i] - b) < 0.03
            (mixed if near else decode).append(1000 * (b - a))
    ttft = [1000 * (r["chunk_times"][0] - r["sent_at"]) for r in reqs]
    fmt = lambda v: f"median {st.median(v):.0f} mean {st.mean(v):.0f} ms (n {len(v)})" if v else "none"
    return (f"TTFT {fmt(ttft)}; steps that emit a first token: {fmt(mixed)}; other steps: {fmt(decode)}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="inferq bench ttft-trace", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    w = sub.add_parser("worker", help="run a worker with the trace (worker flags after --)")
    w.add_argument("--trace-out", required=True)
    w.add_argument("worker_args", nargs=argparse.REMAINDER)
    r = sub.add_parser("report", help="phases of each request's TTFT from a trace and its bench result")
    r.add_argument("trace")
    r.add_argument("result")
    s = sub.add_parser("steps", help="step durations seen by the client, from bench serve result files")
    s.add_argument("results", nargs="+")
    args = p.parse_args(argv)
    if args.cmd == "worker":
        install(args.trace_out)
        from inferq.gpuworker.service.cli import main as worker_main

        rest = args.worker_args[1:] if args.worker_args[:1] == ["--"] else args.worker_args
        return worker_main(rest)
    if args.cmd == "report":
        print(report(json.loads(Path(args.trace).read_text()), json.loads(Path(args.result).read_text())))
        return 0
    for path in args.results:
        print(f"{path}: {client_steps(json.loads(Path(path).read_text()))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
