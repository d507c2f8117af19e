"""Measure what inferq costs Redis: commands, bytes and redis-server CPU per job
and per reply event, on this machine, with the real code paths.

    inferq bench redis-cost                 # tiny model, ~1-2 min
    inferq bench redis-cost --jobs 128 --tokens 128 --json out.json

What runs: a private redis-server (>= 7 if one is found; AOF everysec and
noeviction, as in production), one real worker process (`python -m
inferq.gpuworker.service`, default settings for leases and heartbeats) on a tiny random
model (inferq.bench.step.make_tiny_model; the model's size does not change the Redis traffic
per token), and real producers: `Producer.submit` (the admission Lua script)
and one `JobHandle.result()` follower per job, reading its reply stream with
XREAD BLOCK while the job runs, as a streaming client does.

Phases, each measured as the difference of INFO commandstats / stats / cpu
before and after:
  idle   worker connected, no jobs: the background cost per worker-second
         (heartbeat, lease refresh, reaper XAUTOCLAIM, queue gauges, blocked XREADGROUP)
  short  N jobs with max_tokens=1: queued, started, 1 delta, done = 4 reply events
  long   N jobs with max_tokens=T (EOS ignored): 3 + T reply events

per job   = short phase / N  (minus the idle background over the phase's duration, for CPU)
per event = (long - short) / (N * (T - 1))   one more generated token = one more
            delta event, its share of the per-step pipeline (incl. the per-step
            cancel EXISTS of every job in flight) and of the client's XREADs.
CPU is redis-server's own used_cpu_sys + used_cpu_user (getrusage of the server),
so other load on the machine changes it little; the machine's CPU speed does.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import redis

from inferq.ports import free_port
from inferq.schemas import keys

MODEL = "cost-probe"
IGNORE = {"info", "config|resetstat", "config", "ping", "client|setinfo", "client|setname", "hello"}


def version(binary: str) -> tuple:
    out = subprocess.run([binary, "--version"], capture_output=True, text=True).stdout
    m = re.search(r"v=(\d+)\.(\d+)\.(\d+)", out)
    return tuple(map(int, m.groups())) if m else (0, 0, 0)


def find_redis(explicit: str | None) -> str:
    if explicit:
        return explicit
    cands = [str(Path(d) / "redis-server") for d in os.environ.get("PATH", "").split(os.pathsep)]
    cands = [c for c in dict.fromkeys(cands) if os.path.isfile(c) and os.access(c, os.X_OK)]
    if not cands:
        sys.exit("no redis-server on PATH (--redis-server PATH)")
    return max(cands, key=version)


class Stats:
    """A snapshot of the server counters this script diffs."""

    def __init__(self, r: redis.Redis):
        cs = r.info("commandstats")
        st = r.info("stats")
        cpu = r.info("cpu")
        self.t = time.time()
        self.cmds = {k[len("cmdstat_"):]: (v["calls"], v["usec"]) for k, v in cs.items()}
        self.net_in = st["total_net_input_bytes"]
        self.net_out = st["total_net_output_bytes"]
        self.cpu_s = cpu["used_cpu_sys"] + cpu["used_cpu_user"]

    def __sub__(self, o: "Stats") -> dict:
        calls, usec = {}, {}
        for k, (c, u) in self.cmds.items():
            if k in IGNORE:
                continue
            c0, u0 = o.cmds.get(k, (0, 0))
            if c - c0:
                calls[k] = c - c0
                usec[k] = u - u0
        return {"seconds": self.t - o.t, "calls": calls, "cmd_usec": usec, "commands": sum(calls.values()),
                "bytes_in": self.net_in - o.net_in, "bytes_out": self.net_out - o.net_out,
                "cpu_us": (self.cpu_s - o.cpu_s) * 1e6}


def run_jobs(url: str, n: int, max_tokens: int, r: redis.Redis) -> tuple[dict, int]:
    from inferq.producer import Producer

    p = Producer(url, default_model=MODEL, max_backlog=100_000)
    sampling = {"max_tokens": max_tokens, "temperature": 0.0, "ignore_eos": True}
    before = Stats(r)
    handles = [p.submit(f"cost probe {i}", sampling=sampling) for i in range(n)]
    with ThreadPoolExecutor(max_workers=min(n, 256)) as ex:
        results = list(ex.map(lambda h: h.result(timeout=600), handles))
    while r.xlen(keys.jobs(MODEL)):  # the last XACK+XDEL rides with the done event
        time.sleep(0.01)
    after = Stats(r)
    tokens = sum(x.usage.completion_tokens for x in results)
    assert tokens == n * max_tokens, (tokens, n * max_tokens)
    # Every reply stream is still there (TTL 1 h): count the events written.
    events = sum(r.xlen(keys.reply(h.id)) for h in handles)
    p.close()
    d = after - before
    d["events"] = events
    return d, tokens


def per(d: dict, k: float) -> dict:
    out = {"commands": d["commands"] / k, "bytes_in": d["bytes_in"] / k, "bytes_out": d["bytes_out"] / k,
           "cpu_us": d["cpu_us"] / k, "calls": {c: v / k for c, v in sorted(d["calls"].items()) if v}}
    if "cmd_usec" in d:  # time inside each command (commandstats), per call
        out["usec_per_call"] = {c: round(d["cmd_usec"][c] / d["calls"][c], 2)
                                for c in sorted(d["calls"]) if d["calls"][c] > 0}
    return out


def lease_round(url: str, held: int, rounds: int) -> dict:
    """Replay one worker's lease refresh (gpuworker/service/lease.py LeaseKeeper.refresh):
    XPENDING of its own entries, then XCLAIM ... JUSTID of the ones it holds, with
    ``held`` jobs in flight."""
    r = redis.Redis.from_url(url)
    s = keys.jobs("lease-probe")
    r.delete(s)
    r.xgroup_create(s, keys.JOBS_GROUP, id="0", mkstream=True)
    p = r.pipeline(transaction=False)
    for i in range(held):
        p.xadd(s, {"job": "x" * 300})
    p.execute()
    got = r.xreadgroup(keys.JOBS_GROUP, "lease-1", {s: ">"}, count=held)
    ids = [eid for eid, _ in got[0][1]]
    before = Stats(r)
    for _ in range(rounds):
        rows = r.xpending_range(s, keys.JOBS_GROUP, min="-", max="+", count=max(1000, 4 * held),
                                consumername="lease-1")
        mine = [row["message_id"] for row in rows]
        r.xclaim(s, keys.JOBS_GROUP, "lease-1", 0, mine, justid=True)
    d = Stats(r) - before
    r.delete(s)
    r.close()
    out = per(d, rounds)
    out["held"] = held
    out["cpu_us_per_held_job"] = out["cpu_us"] / held
    return out


def stop_worker(worker: subprocess.Popen) -> None:
    if worker.poll() is None:
        worker.send_signal(signal.SIGTERM)
        try:
            worker.wait(60)
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="inferq bench redis-cost", description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=64, help="jobs per phase (also the worker's --max-num-seqs)")
    ap.add_argument("--tokens", type=int, default=64, help="max_tokens of the long phase")
    ap.add_argument("--idle-s", type=float, default=20.0, help="length of the idle phase")
    ap.add_argument("--redis-server", help="redis-server binary (default: the newest on PATH)")
    ap.add_argument("--model", help="model folder for the worker (default: a tiny random Llama)")
    ap.add_argument("--no-aof", action="store_true", help="run Redis without AOF")
    ap.add_argument("--lease-held", type=int, default=256, help="jobs held by the replayed lease refresh")
    ap.add_argument("--json", help="write the results here too")
    a = ap.parse_args(argv)

    tmp = Path(tempfile.mkdtemp(prefix="inferq-cost-"))
    binary = find_redis(a.redis_server)
    port = free_port()
    rs = subprocess.Popen([binary, "--port", str(port), "--bind", "127.0.0.1", "--dir", str(tmp), "--save", "",
                           "--appendonly", "no" if a.no_aof else "yes", "--appendfsync", "everysec",
                           "--maxmemory-policy", "noeviction"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"redis://127.0.0.1:{port}/0"
    worker = None
    try:
        r = redis.Redis.from_url(url)
        for _ in range(200):
            try:
                r.ping()
                break
            except redis.ConnectionError:
                time.sleep(0.05)
        if a.model:
            model = a.model
        else:
            from inferq.bench.step import make_tiny_model

            model = str(make_tiny_model(tmp / "tiny"))
        env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"), TOKENIZERS_PARALLELISM="false")
        log = open(tmp / "worker.log", "wb")
        worker = subprocess.Popen([sys.executable, "-m", "inferq.gpuworker.service", "--redis-url", url, "--model", model,
                                   "--served-model-name", MODEL, "--worker-id", "cost-1",
                                   "--max-num-seqs", str(a.jobs), "--num-kv-blocks", str(max(512, a.jobs * 16)),
                                   "--log-level", "warning"], env=env, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.time() + 300
        while r.zscore(keys.workers(MODEL), "cost-1") is None:
            if worker.poll() is not None or time.time() > deadline:
                sys.exit("worker did not start:\n" + (tmp / "worker.log").read_text()[-3000:])
            time.sleep(0.1)

        run_jobs(url, 4, 2, r)  # warm-up: scripts loaded, connections open, engine warmed
        s0 = Stats(r)
        time.sleep(a.idle_s)  # measuring a fixed window of background traffic
        idle = Stats(r) - s0
        short, _ = run_jobs(url, a.jobs, 1, r)
        long_, tokens = run_jobs(url, a.jobs, a.tokens, r)
        # The replayed lease refresh alone on the server: the live worker's own lease
        # round (an XPENDING every few seconds) would land in its counters now and then.
        stop_worker(worker)
        lease = lease_round(url, a.lease_held, 200)
    finally:
        if worker is not None:
            stop_worker(worker)
        rs.terminate()
        rs.wait(10)
        shutil.rmtree(tmp, ignore_errors=True)

    n, extra_events = a.jobs, a.jobs * (a.tokens - 1)
    bg_cpu_per_s = idle["cpu_us"] / idle["seconds"]
    job = per(short, n)
    job["cpu_us_minus_background"] = (short["cpu_us"] - bg_cpu_per_s * short["seconds"]) / n
    diff = {k: long_[k] - short[k] for k in ("commands", "bytes_in", "bytes_out", "cpu_us")}
    diff["calls"] = {c: long_["calls"].get(c, 0) - short["calls"].get(c, 0)
                     for c in set(long_["calls"]) | set(short["calls"])}
    diff["calls"] = {c: v for c, v in diff["calls"].items() if abs(v) >= 1}
    diff["cpu_us_minus_background"] = diff["cpu_us"] - bg_cpu_per_s * (long_["seconds"] - short["seconds"])
    event = per(diff, extra_events)
    event["cpu_us_minus_background"] = diff["cpu_us_minus_background"] / extra_events
    out = {
        "redis_server": f"{binary} {'.'.join(map(str, version(binary)))}", "aof": not a.no_aof,
        "jobs": n, "tokens": a.tokens,
        "events_short_phase_per_job": short["events"] / n, "events_long_phase_per_job": long_["events"] / n,
        "idle_per_worker_second": per(idle, idle["seconds"]),
        "per_job": job, "per_event": event, "lease_refresh_round": lease,
        "long_phase_usec_per_call": per(long_, 1)["usec_per_call"],
        "phase_seconds": {"short": short["seconds"], "long": long_["seconds"]},
        "long_phase_cpu_us": long_["cpu_us"],
        "long_phase_tokens_per_s": tokens / long_["seconds"],
    }
    print(json.dumps(out, indent=1, sort_keys=True))
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=1, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
