"""Queue lanes on real processes: priority classes, fair share between tenants,
prefix affinity. Each part starts its own worker processes (``python -m
inferq.gpuworker.service``, bundled SmolLM2-135M-Instruct unless ``--model``) on a
private redis-server and drives them through the producer SDK.

    inferq bench lanes --part all --json docs/bench/lanes.json
    inferq bench lanes --part priority          # or fairness | affinity

Parts (every time is a median; read ratios, not seconds, on a shared machine):

priority   one worker (--max-num-seqs 8). 10 interactive jobs (64 random prompt
           ids, 16 tokens), one at a time, on an idle worker: median TTFT. Then
           300 batch jobs (64 ids, 32 tokens) are queued, and once the worker
           runs 8 of them the 10 interactive jobs (fresh ids: no prefix-cache
           help) go in the same way: median TTFT and queue wait, how many batch
           jobs were still waiting when each started, and the worker's
           priority preemptions. Contrast: 3 probes sent as class "batch"
           behind a backlog kept at 32 batch jobs (plain FIFO; the wait grows
           linearly with the backlog, ~0.75 s per batch job here).
fairness   one worker (--max-num-seqs 8). Tenant A floods 500 jobs (4 tokens,
           short prompts), then tenant B submits 10. B's median queue wait
           with fair share off and on, and on an empty queue (baseline).
affinity   two workers (--max-num-seqs 8 each). 8 sessions, each a ~600-token
           random prefix + a short unique suffix, 6 rounds (one request per
           session at once, in a shuffled order, then wait for all). With session_id vs without:
           prefix-cache hit rate after each session's first request, and TTFT.
           Each run uses its own prefixes, so neither reuses the other's cache.
           A second scenario puts the caches under pressure: 16 sessions (8 per
           worker at once), 4 rounds, --num-kv-blocks 400 per worker (the
           running jobs plus ~2 more prefixes), so a worker cannot keep every
           session's prefix (--pressure-sessions 0 skips it).

Workers run with OMP_NUM_THREADS=1 and --dtype float32 unless told otherwise.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Optional

import redis

import inferq
from inferq.ports import free_port
from inferq.producer import Producer
from inferq.producer.queue_stats import lane_stats
from inferq.schemas import keys
from inferq.schemas.queues import Lane, lanes_of

VOCAB_LO, VOCAB_HI = 200, 49000  # SmolLM2 vocabulary is 49152; stay clear of special ids
GREEDY = {"temperature": 0.0, "ignore_eos": True}


# -- helpers -------------------------------------------------------------------------------
def med(xs) -> Optional[float]:
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def fmt(x, digits: int = 3) -> str:
    return "–" if x is None else f"{x:.{digits}f}"


def ratio(a, b) -> Optional[float]:
    return None if a is None or not b else a / b


def say(*a) -> None:
    print(time.strftime("[%H:%M:%S]"), *a, flush=True)


def table(header: list[str], rows: list[list]) -> str:
    out = ["| " + " | ".join(header) + " |",
           "| " + " | ".join(["---"] + ["---:"] * (len(header) - 1)) + " |"]
    out += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(out)


def wait_for(pred, timeout: float, what: str, every: float = 0.05):
    end = time.time() + timeout
    while time.time() < end:
        v = pred()
        if v:
            return v
        time.sleep(every)
    raise TimeoutError(f"timed out waiting for {what}")


class Tokens:
    """Random prompt ids from one seeded generator (every prompt distinct)."""

    def __init__(self, seed: int):
        self.rng = random.Random(seed)

    def ids(self, n: int) -> list[int]:
        return [self.rng.randrange(VOCAB_LO, VOCAB_HI) for _ in range(n)]


# -- processes -----------------------------------------------------------------------------
class RedisServer:
    def __init__(self):
        exe = shutil.which("redis-server")
        if exe is None:
            sys.exit("no redis-server on PATH")
        self.port = free_port()
        self.dir = tempfile.mkdtemp(prefix="inferq-bench-lanes-")
        self.proc = subprocess.Popen([exe, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", self.dir,
                                      "--save", "", "--appendonly", "no"],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.url = f"redis://127.0.0.1:{self.port}/0"
        r = redis.Redis.from_url(self.url)
        wait_for(lambda: _pings(r), 10, "redis-server")
        r.close()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


def _pings(r) -> bool:
    try:
        return bool(r.ping())
    except redis.ConnectionError:
        return False


class WorkerProc:
    """``python -m inferq.gpuworker.service`` with its log in a file and /metrics on a free port."""

    def __init__(self, args: argparse.Namespace, redis_url: str, served: str, worker_id: str, log_dir: Path,
                 *extra: str):
        self.redis_url, self.served, self.worker_id = redis_url, served, worker_id
        self.metrics_port = free_port()
        self.log_path = log_dir / f"worker-{served}-{worker_id}.log"
        cmd = [sys.executable, "-m", "inferq.gpuworker.service", "--redis-url", redis_url, "--served-model-name", served,
               "--worker-id", worker_id, "--metrics-port", str(self.metrics_port), "--metrics-addr", "127.0.0.1",
               "--dtype", args.dtype, "--log-level", "warning", *extra]
        if args.model:
            cmd += ["--model", args.model]
        threads = str(args.worker_threads)
        env = dict(os.environ, OMP_NUM_THREADS=threads, MKL_NUM_THREADS=threads, TOKENIZERS_PARALLELISM="false")
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(cmd, env=env, stdout=self._log, stderr=subprocess.STDOUT)

    def wait_ready(self, timeout: float = 300) -> "WorkerProc":
        r = redis.Redis.from_url(self.redis_url)
        try:
            end = time.time() + timeout
            while time.time() < end:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"worker {self.worker_id} exited ({self.proc.returncode}):\n{self.log()[-3000:]}")
                if r.zscore(keys.workers(self.served), self.worker_id) is not None:
                    return self
                time.sleep(0.1)
        finally:
            r.close()
        raise TimeoutError(f"worker {self.worker_id} not ready in {timeout}s:\n{self.log()[-3000:]}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def metric(self, name: str, **labels) -> float:
        """Sum of a metric's samples whose labels include ``labels``."""
        text = urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=10).read().decode()
        total = 0.0
        for line in text.splitlines():
            if not line or line.startswith("#"):
                continue
            k, _, v = line.rpartition(" ")
            base, _, rest = k.partition("{")
            if base == name and all(f'{lk}="{lv}"' in rest for lk, lv in labels.items()):
                total += float(v)
        return total

    def stop(self, timeout: float = 30) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()  # SIGTERM: drains (bounded by --drain-timeout), then exits
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()


def start_workers(args, url: str, served: str, ids: list[str], log_dir: Path, *extra: str) -> list[WorkerProc]:
    t0 = time.time()
    ws = [WorkerProc(args, url, served, wid, log_dir, "--drain-timeout", "5", *extra) for wid in ids]
    try:
        for w in ws:
            w.wait_ready()
    except BaseException:
        for w in ws:
            w.stop(5)
        raise
    say(f"workers {ids} ready in {time.time() - t0:.1f}s")
    return ws


def started_times(r, job_ids: list[str]) -> list[float]:
    """started_at of each job (inf while it has not started)."""
    pipe = r.pipeline(transaction=False)
    for jid in job_ids:
        pipe.hget(keys.job_info(jid), "started_at")
    return [float(v) if v else float("inf") for v in pipe.execute()]


def waiting_in(r, served: str, cls: Optional[str] = None, tenant: Optional[str] = None) -> int:
    n = 0
    for ln in lanes_of(r, served):
        if (cls is None or ln.cls == cls) and (tenant is None or ln.tenant == tenant):
            n += lane_stats(r, ln).waiting
    return n


def pending_in(r, served: str) -> int:
    return sum(lane_stats(r, ln).pending for ln in lanes_of(r, served))


def drain(p: Producer, handles, timeout: float = 120) -> None:
    """Cancel what has not finished and wait until the model's lanes are empty."""
    for h in handles:
        try:
            h.cancel()
        except Exception:
            pass
    wait_for(lambda: p.depth() == 0, timeout, "the lanes to empty after cancelling", every=0.2)


# -- part 1: priority classes -------------------------------------------------------------
def probe_one(p: Producer, ids: list[int], max_tokens: int, cls: str, r, served: str, timeout: float) -> dict:
    batch_waiting_at_submit = waiting_in(r, served, cls="batch")
    h = p.submit(prompt_token_ids=ids, sampling={**GREEDY, "max_tokens": max_tokens}, priority_class=cls)
    res = h.result(timeout=timeout)
    st = h.status()
    # when Redis appended it to its lane (the stream entry id's milliseconds, Redis's clock = this machine's)
    xadd_at = int(str(h.entry_id).split("-")[0]) / 1000 if h.entry_id else st.get("created_at")
    return {"job_id": h.id, "ttft": res.timings.ttft, "queue": res.timings.queue, "total": res.timings.total,
            "completion_tokens": res.usage.completion_tokens, "started_at": st.get("started_at"),
            "created_at": st.get("created_at"), "xadd_at": xadd_at, "batch_waiting_at_submit": batch_waiting_at_submit}


def part_priority(args, rs: RedisServer, log_dir: Path) -> dict:
    served = "bench-prio"
    tok = Tokens(args.seed + 1)
    n, plen, itok, btok = args.interactive_jobs, args.prompt_tokens, 16, 32
    w = start_workers(args, rs.url, served, ["prio-w"], log_dir, "--max-num-seqs", "8")[0]
    p = Producer(rs.url, default_model=served)
    r = p.redis
    out: dict = {"worker_flags": "--max-num-seqs 8 (interactive reserve 4, the default)"}
    try:
        # warm-up: one job of each shape, not measured
        for m in (itok, btok):
            p.submit(prompt_token_ids=tok.ids(plen), sampling={**GREEDY, "max_tokens": m}).result(timeout=120)

        say(f"priority: {n} interactive jobs on an idle worker")
        idle = [probe_one(p, tok.ids(plen), itok, "interactive", r, served, 120) for _ in range(n)]

        say(f"priority: queue {args.batch_jobs} batch jobs")
        pre0 = w.metric("inferq:num_preemptions_total", reason="priority")
        batch = [p.submit(prompt_token_ids=tok.ids(plen), sampling={**GREEDY, "max_tokens": btok},
                          priority_class="batch") for _ in range(args.batch_jobs)]
        wait_for(lambda: pending_in(r, served) >= 8, 120, "the worker running 8 batch jobs")
        time.sleep(1.0)  # let them decode a little
        done_before = sum(1 for t in started_times(r, [h.id for h in batch]) if t != float("inf"))
        say(f"priority: worker busy ({done_before} batch jobs started); {n} interactive jobs, one at a time")
        loaded = [probe_one(p, tok.ids(plen), itok, "interactive", r, served, 300) for _ in range(n)]
        pre1 = w.metric("inferq:num_preemptions_total", reason="priority")
        bstarts = started_times(r, [h.id for h in batch])
        for row in loaded:
            row["batch_waiting_at_start"] = sum(1 for t in bstarts if t > row["started_at"])
            # batch jobs that started while this interactive job waited in Redis (taken ahead of it); a
            # batch job's started_at is stamped after its claim round trip, so one read just before the
            # XADD can land a few ms after it: gaps_ms says how long after the XADD each one started
            ahead = [t for t in bstarts if row["xadd_at"] <= t < row["started_at"]]
            row["batch_started_while_waiting"] = len(ahead)
            row["batch_started_while_waiting_gaps_ms"] = [round(1000 * (t - row["xadd_at"]), 1) for t in ahead]
        batch_started = sum(1 for t in bstarts if t != float("inf"))
        say(f"priority: {batch_started} of {len(batch)} batch jobs had started; cancelling the rest")
        drain(p, batch)

        # contrast: the probes as class "batch" behind a backlog kept at args.contrast_backlog (FIFO)
        fifo: list[dict] = []
        if args.contrast_probes:
            say(f"priority: contrast, {args.contrast_probes} probes as batch behind {args.contrast_backlog} batch jobs")
            backlog = [p.submit(prompt_token_ids=tok.ids(plen), sampling={**GREEDY, "max_tokens": btok},
                                priority_class="batch") for _ in range(args.contrast_backlog)]
            stop = threading.Event()

            def top_up():
                tp = Producer(rs.url, default_model=served)
                while not stop.is_set():
                    short = args.contrast_backlog - waiting_in(tp.redis, served, cls="batch")
                    for _ in range(max(0, short - 1)):  # the probe itself counts as one
                        backlog.append(tp.submit(prompt_token_ids=tok.ids(plen),
                                                 sampling={**GREEDY, "max_tokens": btok}, priority_class="batch"))
                    stop.wait(0.2)
                tp.close()

            wait_for(lambda: pending_in(r, served) >= 8, 120, "the worker running 8 batch jobs")
            t = threading.Thread(target=top_up, daemon=True)
            t.start()
            try:
                for _ in range(args.contrast_probes):
                    fifo.append(probe_one(p, tok.ids(plen), itok, "batch", r, served, 600))
                    say(f"priority: contrast probe ttft {fifo[-1]['ttft']:.1f}s")
            finally:
                stop.set()
                t.join()
            drain(p, backlog)

        s_idle, s_load = med(x["ttft"] for x in idle), med(x["ttft"] for x in loaded)
        summary = {
            "idle_ttft_median": s_idle, "idle_queue_median": med(x["queue"] for x in idle),
            "loaded_ttft_median": s_load, "loaded_queue_median": med(x["queue"] for x in loaded),
            "loaded_over_idle_ttft": ratio(s_load, s_idle),
            "batch_waiting_at_interactive_start": [x["batch_waiting_at_start"] for x in loaded],
            "batch_started_while_interactive_waited": [x["batch_started_while_waiting"] for x in loaded],
            "batch_started_before_probes": done_before, "batch_started_total": batch_started,
            "priority_preemptions": pre1 - pre0,
            "fifo_ttft_median": med(x["ttft"] for x in fifo), "fifo_queue_median": med(x["queue"] for x in fifo),
            "fifo_over_idle_ttft": ratio(med(x["ttft"] for x in fifo), s_idle),
        }
        out.update(summary=summary, idle=idle, loaded=loaded, fifo=fifo,
                   workload={"interactive_jobs": n, "prompt_tokens": plen, "interactive_max_tokens": itok,
                             "batch_jobs": args.batch_jobs, "batch_max_tokens": btok,
                             "contrast_probes": args.contrast_probes, "contrast_backlog": args.contrast_backlog})
        return out
    finally:
        p.close()
        w.stop()


def report_priority(res: dict) -> str:
    s, wl = res["summary"], res["workload"]
    rows = [
        ["idle worker", wl["interactive_jobs"], fmt(s["idle_queue_median"]), fmt(s["idle_ttft_median"]), "1.00x", "–"],
        [f"{wl['batch_jobs']} batch jobs queued, probes interactive", wl["interactive_jobs"],
         fmt(s["loaded_queue_median"]), fmt(s["loaded_ttft_median"]), f"{fmt(s['loaded_over_idle_ttft'], 2)}x",
         f"{int(s['priority_preemptions'])}"],
    ]
    if res["fifo"]:
        rows.append([f"~{wl['contrast_backlog']} batch jobs waiting, probes sent as batch (FIFO)", len(res["fifo"]),
                     fmt(s["fifo_queue_median"]), fmt(s["fifo_ttft_median"]), f"{fmt(s['fifo_over_idle_ttft'], 1)}x", "–"])
    t1 = table(["case", "probes", "median queue s", "median TTFT s", "TTFT vs idle", "priority preemptions"], rows)
    rows2 = [[i + 1, x["batch_waiting_at_submit"], x["batch_waiting_at_start"],
              f"{x['batch_started_while_waiting']}" + (f" ({', '.join(str(g) for g in x['batch_started_while_waiting_gaps_ms'])} ms after its XADD)"
                                                     if x.get("batch_started_while_waiting_gaps_ms") else ""),
              fmt(x["queue"]), fmt(x["ttft"])] for i, x in enumerate(res["loaded"])]
    t2 = table(["interactive probe", "batch waiting at submit", "batch not yet started at its start",
                "batch jobs started while it waited", "queue s", "TTFT s"], rows2)
    return t1 + "\n\n" + t2


# -- part 2: fair share -----------------------------------------------------------------------
def fair_run(args, url: str, served: str, fair: bool, flood: int, tok: Tokens, label: str) -> dict:
    pa = Producer(url, default_model=served, fair_share=fair)
    pb = Producer(url, default_model=served, fair_share=fair)
    try:
        t0 = time.time()
        a = [pa.submit(prompt_token_ids=tok.ids(args.fair_prompt_tokens), sampling={**GREEDY, "max_tokens": 4},
                       tenant="a") for _ in range(flood)]
        t_flood = time.time() - t0
        b = [pb.submit(prompt_token_ids=tok.ids(args.fair_prompt_tokens), sampling={**GREEDY, "max_tokens": 4},
                       tenant="b") for _ in range(args.fair_b_jobs)]
        bres = [h.result(timeout=600) for h in b]
        t_b = time.time() - t0
        a_started = sum(1 for t in started_times(pa.redis, [h.id for h in a]) if t != float("inf"))
        b_last_start = max(started_times(pb.redis, [h.id for h in b]))
        a_started_before_b_last = sum(1 for t in started_times(pa.redis, [h.id for h in a]) if t < b_last_start)
        say(f"fairness [{label}]: B done {t_b:.1f}s after the flood began; {a_started}/{flood} A jobs started by then")
        if a:
            drain(pa, a, timeout=300)
        return {"fair_share": fair, "flood": flood, "flood_submit_s": t_flood,
                "b_queue": [x.timings.queue for x in bres], "b_ttft": [x.timings.ttft for x in bres],
                "b_total": [x.timings.total for x in bres], "b_queue_median": med(x.timings.queue for x in bres),
                "b_ttft_median": med(x.timings.ttft for x in bres), "b_done_after_s": t_b,
                "a_started_when_b_done": a_started, "a_started_before_b_last_start": a_started_before_b_last}
    finally:
        pa.close()
        pb.close()


def part_fairness(args, rs: RedisServer, log_dir: Path) -> dict:
    served = "bench-fair"
    tok = Tokens(args.seed + 2)
    w = start_workers(args, rs.url, served, ["fair-w"], log_dir, "--max-num-seqs", "8")[0]
    try:
        # warm-up, not measured: the default lane and both tenants' fair-share lanes exist
        # and the worker has listed them (it re-reads the lane set every second)
        warm = Producer(rs.url, default_model=served, fair_share=True)
        for tenant in (None, "a", "b"):
            warm.submit(prompt_token_ids=tok.ids(args.fair_prompt_tokens), sampling={**GREEDY, "max_tokens": 4},
                        tenant=tenant).result(timeout=120)
        warm.close()
        time.sleep(1.5)
        say("fairness: baseline (B alone)")
        base = fair_run(args, rs.url, served, True, 0, tok, "baseline")
        say(f"fairness: fair share off, A floods {args.fair_flood}")
        off = fair_run(args, rs.url, served, False, args.fair_flood, tok, "off")
        say(f"fairness: fair share on, A floods {args.fair_flood}")
        on = fair_run(args, rs.url, served, True, args.fair_flood, tok, "on")
    finally:
        w.stop()
    b0 = base["b_queue_median"]
    return {"workload": {"flood": args.fair_flood, "b_jobs": args.fair_b_jobs, "prompt_tokens": args.fair_prompt_tokens,
                         "max_tokens": 4}, "worker_flags": "--max-num-seqs 8",
            "baseline": base, "off": off, "on": on,
            "summary": {"baseline_b_queue_median": b0, "off_b_queue_median": off["b_queue_median"],
                        "on_b_queue_median": on["b_queue_median"], "off_factor": ratio(off["b_queue_median"], b0),
                        "on_factor": ratio(on["b_queue_median"], b0)}}


def report_fairness(res: dict) -> str:
    wl = res["workload"]
    rows = []
    for key, label in (("baseline", "B alone, empty queue"), ("off", f"after A's {wl['flood']}, fair share off"),
                       ("on", f"after A's {wl['flood']}, fair share on")):
        x = res[key]
        f = ratio(x["b_queue_median"], res["baseline"]["b_queue_median"])
        ft = ratio(x["b_ttft_median"], res["baseline"]["b_ttft_median"])
        rows.append([label, fmt(x["b_queue_median"]), f"{fmt(f, 1)}x", fmt(x["b_ttft_median"]), f"{fmt(ft, 1)}x",
                     fmt(x["b_done_after_s"], 1), x["a_started_before_b_last_start"] if x["flood"] else "–"])
    return table(["tenant B's 10 jobs", "median queue s", "queue vs baseline", "median TTFT s", "TTFT vs baseline",
                  "all B done after s", "A jobs started before B's last"], rows)


# -- part 3: prefix affinity -----------------------------------------------------------------
def affinity_run(p: Producer, tok: Tokens, args, sessions_n: int, rounds: int, with_session: bool,
                 label: str) -> dict:
    sessions = [f"{label}-s{i}" for i in range(sessions_n)]
    prefixes = {s: tok.ids(args.prefix_tokens) for s in sessions}
    rows: list[dict] = []
    for rnd in range(rounds):
        hs = []
        order = sessions[:]
        tok.rng.shuffle(order)  # requests of one round arrive in no fixed order
        for s in order:
            ids = prefixes[s] + tok.ids(args.suffix_tokens)
            kw = {"session_id": s} if with_session else {}
            hs.append((s, p.submit(prompt_token_ids=ids, sampling={**GREEDY, "max_tokens": args.affinity_max_tokens}, **kw)))
        for s, h in hs:
            res = h.result(timeout=300)
            st = h.status()
            rows.append({"round": rnd + 1, "session": s, "worker": st.get("worker"), "ttft": res.timings.ttft,
                         "queue": res.timings.queue, "total": res.timings.total,
                         "prompt_tokens": res.usage.prompt_tokens, "cached_tokens": res.usage.cached_tokens})
        rr = [x for x in rows if x["round"] == rnd + 1]
        say(f"affinity [{label}] round {rnd + 1}: hit {sum(x['cached_tokens'] for x in rr) / max(1, sum(x['prompt_tokens'] for x in rr)):.2f}, "
            f"median ttft {med(x['ttft'] for x in rr):.2f}s, per worker {per_worker(rr)}")
    later = [x for x in rows if x["round"] > 1]
    by_round = []
    for rnd in range(1, rounds + 1):
        rr = [x for x in rows if x["round"] == rnd]
        by_round.append({"round": rnd, "hit_rate": hit_rate(rr), "ttft_median": med(x["ttft"] for x in rr),
                         "per_worker": per_worker(rr)})
    # how often a session's request ran on another worker than its previous one
    moves = 0
    for s in sessions:
        ws = [x["worker"] for x in rows if x["session"] == s]
        moves += sum(1 for a, b in zip(ws, ws[1:]) if a != b)
    return {"session_id": with_session, "rows": rows, "by_round": by_round,
            "hit_rate_after_first": hit_rate(later),
            "ttft_median_after_first": med(x["ttft"] for x in later),
            "ttft_mean_after_first": statistics.fmean(x["ttft"] for x in later) if later else None,
            "ttft_median_first_round": by_round[0]["ttft_median"],
            "session_moves": moves, "requests_per_worker": per_worker(rows)}


def hit_rate(rows: list[dict]) -> float:
    return sum(x["cached_tokens"] for x in rows) / max(1, sum(x["prompt_tokens"] for x in rows))


def per_worker(rows: list[dict]) -> dict[str, int]:
    return {wk: sum(1 for x in rows if x["worker"] == wk) for wk in AFF_WORKERS}


AFF_WORKERS = ("aff-w1", "aff-w2")


def affinity_scenario(args, rs: RedisServer, log_dir: Path, name: str, sessions_n: int, kv_blocks: int,
                      rounds: int, seed: int) -> dict:
    served = f"bench-aff-{name}"
    tok = Tokens(seed)
    extra = ["--max-num-seqs", "8"] + (["--num-kv-blocks", str(kv_blocks)] if kv_blocks else [])
    ws = start_workers(args, rs.url, served, list(AFF_WORKERS), log_dir, *extra)
    p = Producer(rs.url, default_model=served)
    try:
        # warm both workers (short jobs, not measured), get both workers' affinity lanes made
        # and listed (a worker sees a new lane within ~1 s), so the measured runs do not pay
        # for lane discovery
        for rnd in range(3):
            hs = [p.submit(prompt_token_ids=tok.ids(32), sampling={**GREEDY, "max_tokens": 2}, session_id=f"warm-{i}")
                  for i in range(2 * sessions_n)]
            for h in hs:
                h.result(timeout=120)
        owners = sorted({ln.owner for ln in lanes_of(p.redis, served)} - {""})
        say(f"affinity [{name}]: warm-up made owner lanes for {owners}")
        time.sleep(1.5)
        def kv_preemptions() -> int:
            return int(sum(w.metric("inferq:num_preemptions_total", reason="kv") for w in ws))

        runs = {}
        for with_session in ((True, False) if args.affinity_order == "with-first" else (False, True)):
            say(f"affinity [{name}]: {sessions_n} sessions {'with' if with_session else 'without'} session_id")
            k0 = kv_preemptions()
            runs[with_session] = affinity_run(p, tok, args, sessions_n, rounds, with_session,
                                              f"{name}-{'sess' if with_session else 'plain'}")
            runs[with_session]["kv_preemptions"] = kv_preemptions() - k0
        without, withs = runs[False], runs[True]
    finally:
        p.close()
        for w in ws:
            w.stop()
    return {"sessions": sessions_n, "rounds": rounds, "order": args.affinity_order, "kv_blocks": kv_blocks or "default (2 GiB: ~2900 blocks of 16)",
            "worker_flags": " ".join(extra), "without": without, "with": withs}


def part_affinity(args, rs: RedisServer, log_dir: Path) -> dict:
    scen = {"main": affinity_scenario(args, rs, log_dir, "main", args.sessions, args.kv_blocks, args.rounds,
                                      args.seed + 3)}
    if args.pressure_sessions:
        scen["pressure"] = affinity_scenario(args, rs, log_dir, "pressure", args.pressure_sessions,
                                             args.pressure_kv_blocks, args.pressure_rounds, args.seed + 4)
    summary = {}
    for sname, sc in scen.items():
        summary[sname] = {k: {f: sc[k][f] for f in ("hit_rate_after_first", "ttft_median_after_first",
                                                    "ttft_mean_after_first", "ttft_median_first_round",
                                                    "session_moves", "requests_per_worker", "kv_preemptions")}
                          for k in ("without", "with")}
    return {"workload": {"sessions": args.sessions, "rounds": args.rounds, "prefix_tokens": args.prefix_tokens,
                         "suffix_tokens": args.suffix_tokens, "max_tokens": args.affinity_max_tokens,
                         "pressure_sessions": args.pressure_sessions, "pressure_kv_blocks": args.pressure_kv_blocks,
                         "pressure_rounds": args.pressure_rounds},
            "scenarios": scen, "summary": summary}


def report_affinity(res: dict) -> str:
    out = []
    for sname, sc in res["scenarios"].items():
        out.append(f"{sc['sessions']} sessions x {sc['rounds']} rounds, 2 workers `{sc['worker_flags']}` (KV cache: {sc['kv_blocks']} blocks):\n")
        rows = []
        for key, label in (("without", "no session_id (shared lane)"), ("with", "session_id (affinity)")):
            x = sc[key]
            rows.append([label, f"{100 * x['hit_rate_after_first']:.1f} %", fmt(x["ttft_median_after_first"]),
                         fmt(x["ttft_mean_after_first"]), fmt(x["ttft_median_first_round"]), x["session_moves"],
                         " / ".join(str(v) for v in x["requests_per_worker"].values()), x["kv_preemptions"]])
        out.append(table(["run", "prefix hit rate (rounds 2+)", "median TTFT s (rounds 2+)", "mean TTFT s (rounds 2+)",
                          "median TTFT s (round 1)", "times a session changed worker", "requests w1 / w2",
                          "KV preemptions"], rows))
        rows2 = []
        for a, b in zip(sc["without"]["by_round"], sc["with"]["by_round"]):
            rows2.append([a["round"], f"{100 * a['hit_rate']:.0f} %", fmt(a["ttft_median"]),
                          " / ".join(str(v) for v in a["per_worker"].values()),
                          f"{100 * b['hit_rate']:.0f} %", fmt(b["ttft_median"]),
                          " / ".join(str(v) for v in b["per_worker"].values())])
        out.append("\n" + table(["round", "no session: hit", "median TTFT s", "w1 / w2", "session: hit",
                                  "median TTFT s", "w1 / w2"], rows2) + "\n")
    return "\n".join(out)


def code_revision() -> str:
    """The commit under test: BENCH_CODE_REV (e.g. for a ``git archive`` export), else git's HEAD (+dirty)
    of the checkout inferq is imported from (an installed wheel has none: "unknown")."""
    if os.environ.get("BENCH_CODE_REV"):
        return os.environ["BENCH_CODE_REV"]
    checkout = Path(inferq.__file__).resolve().parents[1]
    if not (checkout / ".git").exists():
        return "unknown"
    try:
        rev = subprocess.run(["git", "-C", str(checkout), "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                             timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(checkout), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
        return (rev + ("+dirty" if dirty else "")) if rev else "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


# -- main ------------------------------------------------------------------------------------
PARTS = {"priority": (part_priority, report_priority), "fairness": (part_fairness, report_fairness),
         "affinity": (part_affinity, report_affinity)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="inferq bench lanes", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--part", choices=["priority", "fairness", "affinity", "all"], default="all")
    ap.add_argument("--json", help="write the results (every job's timings too) here")
    ap.add_argument("--report", metavar="JSON", help="only print the tables of an earlier --json file")
    ap.add_argument("--model", default="", help="HF folder or .gguf (default: the bundled SmolLM2-135M-Instruct)")
    ap.add_argument("--dtype", default="float32", help="worker --dtype (float32 | auto | bfloat16)")
    ap.add_argument("--worker-threads", type=int, default=1, help="OMP_NUM_THREADS of each worker")
    ap.add_argument("--seed", type=int, default=0)
    g = ap.add_argument_group("priority")
    g.add_argument("--interactive-jobs", type=int, default=10)
    g.add_argument("--prompt-tokens", type=int, default=64)
    g.add_argument("--batch-jobs", type=int, default=300)
    g.add_argument("--contrast-probes", type=int, default=3, help="probes sent as batch behind a backlog (0 = skip)")
    g.add_argument("--contrast-backlog", type=int, default=32)
    g = ap.add_argument_group("fairness")
    g.add_argument("--fair-flood", type=int, default=500)
    g.add_argument("--fair-b-jobs", type=int, default=10)
    g.add_argument("--fair-prompt-tokens", type=int, default=8)
    g = ap.add_argument_group("affinity")
    g.add_argument("--sessions", type=int, default=8)
    g.add_argument("--rounds", type=int, default=6)
    g.add_argument("--prefix-tokens", type=int, default=600)
    g.add_argument("--suffix-tokens", type=int, default=8)
    g.add_argument("--affinity-max-tokens", type=int, default=8)
    g.add_argument("--kv-blocks", type=int, default=0, help="worker --num-kv-blocks (0 = default sizing)")
    g.add_argument("--pressure-sessions", type=int, default=16,
                   help="second scenario: this many sessions on workers with a small KV cache (0 = skip)")
    g.add_argument("--pressure-kv-blocks", type=int, default=400,
                   help="its --num-kv-blocks: room for the running jobs plus ~2 more prefixes per worker")
    g.add_argument("--pressure-rounds", type=int, default=4)
    g.add_argument("--affinity-order", choices=["without-first", "with-first"], default="without-first",
                   help="which run of a scenario goes first (both use fresh prefixes)")
    args = ap.parse_args(argv)
    if args.report:
        saved = json.loads(Path(args.report).read_text())
        print(f"`{saved['command']}` ({saved['started']} - {saved.get('finished', '?')}, dtype {saved['dtype']})\n")
        for name, res in saved["parts"].items():
            la = res["loadavg"]
            print(f"### {name} ({res['wall_s']} s, load average {la[0]} -> {la[1]})\n\n{PARTS[name][1](res)}\n")
        return 0

    parts = list(PARTS) if args.part == "all" else [args.part]
    log_dir = Path(tempfile.mkdtemp(prefix="inferq-bench-lanes-logs-"))
    rs = RedisServer()
    say(f"redis-server on {rs.url}; worker logs in {log_dir}")
    results: dict = {"command": "inferq bench lanes " + " ".join(argv if argv is not None else sys.argv[1:]),
                     "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "dtype": args.dtype,
                     "worker_threads": args.worker_threads, "model": args.model or "bundled SmolLM2-135M-Instruct",
                     "code": code_revision(),
                     "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                                 "loadavg_start": os.getloadavg()}, "parts": {}}
    reports = []
    try:
        for name in parts:
            run, report = PARTS[name]
            t0 = time.time()
            la0 = os.getloadavg()[0]
            res = run(args, rs, log_dir)
            res["wall_s"] = round(time.time() - t0, 1)
            res["loadavg"] = [round(la0, 2), round(os.getloadavg()[0], 2)]
            results["parts"][name] = res
            text = report(res)
            reports.append((name, text, res["wall_s"], res["loadavg"]))
            print(f"\n### {name} ({res['wall_s']} s, load {res['loadavg'][0]} -> {res['loadavg'][1]})\n\n{text}\n",
                  flush=True)
            if args.json:
                Path(args.json).parent.mkdir(parents=True, exist_ok=True)
                Path(args.json).write_text(json.dumps(results, indent=1))
    finally:
        rs.stop()
    results["finished"] = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    print("\n\n## summary\n")
    for name, text, wall, la in reports:
        print(f"### {name} ({wall} s, load average {la[0]} -> {la[1]})\n\n{text}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
