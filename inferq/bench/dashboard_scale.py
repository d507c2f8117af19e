"""A queue the size of a busy deployment, for the dashboard's bounded-work test
and its benchmark: 10,000 jobs over 100 lanes (50 fair-share tenants x 2
priority classes) of one model, a tenth of each lane delivered to a worker
(pending), their job records, and 200 dead letters.

    inferq bench dashboard-scale     # the figure in docs/benchmarks.md

starts a private redis-server and a gateway, fills the queue, and
prints each JSON view's answer time (first call, then median and max of 20)
and the Redis commands one call costs.
"""
from __future__ import annotations

import json
import statistics
import time

from inferq.schemas import Job, keys, records
from inferq.schemas.queues import Lane

MODEL = "scale"
TENANTS = 50
JOBS = 10_000
DLQ = 200


def lanes() -> list[Lane]:
    return [Lane(MODEL, 0, cls, f"t{i}") for i in range(TENANTS) for cls in keys.CLASSES]


def fill(r) -> list[str]:
    """Returns the job ids."""
    all_lanes = lanes()
    pipe = r.pipeline(transaction=False)
    for ln in all_lanes:
        pipe.sadd(keys.lanes(MODEL, 0), ln.member())
    ids = []
    now = time.time()
    for n in range(JOBS):
        ln = all_lanes[n % len(all_lanes)]
        job = Job(model=MODEL, prompt=f"job {n}", tenant=ln.tenant, priority_class=ln.cls)
        ids.append(job.id)
        pipe.xadd(ln.stream, job.to_fields())
        pipe.hset(keys.job_info(job.id), mapping=records.info_queued(MODEL, ln.tenant, now, None))
        if len(pipe) > 2000:
            pipe.execute()
    pipe.execute()
    for ln in all_lanes:
        r.xgroup_create(ln.stream, keys.JOBS_GROUP, id="0", mkstream=True)
        r.xreadgroup(keys.JOBS_GROUP, "bench-worker", {ln.stream: ">"}, count=JOBS // len(all_lanes) // 10)
    r.zadd(keys.workers(MODEL), {"bench-worker": time.time() + 3600})
    for n in range(DLQ):
        dead = records.DeadLetter(job=json.dumps({"id": f"dead{n}", "model": MODEL, "prompt": "x"}),
                                  job_id=f"dead{n}", entry_id="1-0", code="max_deliveries", reason="bench",
                                  attempts=5, worker="bench-worker", failed_at=time.time())
        pipe.xadd(keys.dlq(MODEL, 0), dead.to_fields())
    pipe.execute()
    return ids


def command_calls(r) -> dict[str, int]:
    out = {}
    for name, stats in r.info("commandstats").items():
        out[name.removeprefix("cmdstat_")] = int(stats["calls"])
    return out


def cost(r, call) -> dict[str, int]:
    """Redis commands one ``call()`` issues (the difference of INFO commandstats, minus the INFO itself)."""
    before = command_calls(r)
    call()
    after = command_calls(r)
    diff = {k: v - before.get(k, 0) for k, v in after.items() if v - before.get(k, 0) > 0}
    diff["info"] = diff.get("info", 1) - 1
    return {k: v for k, v in diff.items() if v}


def views(job_id: str) -> dict[str, str]:
    return {"queues": "/dashboard/api/queues", "workers": "/dashboard/api/workers",
            "series": "/dashboard/api/series", "dlq": "/dashboard/api/dlq?limit=50",
            "job": f"/dashboard/api/jobs/{job_id}", "batches": "/dashboard/api/batches"}


def main(argv=None) -> int:
    """Fill a private redis-server, start a gateway on it, and time every view."""
    import argparse
    import os
    import subprocess
    import sys
    import tempfile
    from pathlib import Path

    import httpx
    import redis

    from inferq.bench.serve_runs import wait_http
    from inferq.embedded_redis import EmbeddedRedis
    from inferq.ports import free_port
    from inferq.processes import terminate

    argparse.ArgumentParser(prog="inferq bench dashboard-scale", description=__doc__.splitlines()[0]).parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        server = EmbeddedRedis(Path(tmp) / "redis").start()
        gateway = None
        try:
            r = redis.Redis.from_url(server.url)
            t0 = time.perf_counter()
            ids = fill(r)
            print(f"filled {JOBS} jobs over {len(lanes())} lanes + {DLQ} dead letters in "
                  f"{time.perf_counter() - t0:.1f} s; {r.dbsize()} keys")
            port = free_port()
            log = Path(tmp) / "gateway.log"
            env = dict(os.environ, INFERQ_REDIS_URL=server.url, INFERQ_GATEWAY_FILES_DIR=str(Path(tmp) / "files"))
            with open(log, "wb") as out:
                gateway = subprocess.Popen([sys.executable, "-m", "inferq.producer.gateway", "--port", str(port)],
                                           env=env, stdout=out, stderr=subprocess.STDOUT)
            url = f"http://127.0.0.1:{port}"
            wait_http(f"{url}/health", gateway, 60, log)
            with httpx.Client(base_url=url, timeout=60) as c:
                print(f"{'view':8} {'first ms':>9} {'p50 ms':>7} {'max ms':>7} {'bytes':>8}  redis commands per call")
                for name, path in views(ids[len(ids) // 2]).items():
                    t = time.perf_counter()
                    first = c.get(path)
                    first_ms = 1000 * (time.perf_counter() - t)
                    assert first.status_code == 200, (path, first.text[:200])
                    times = []
                    for _ in range(20):
                        t = time.perf_counter()
                        c.get(path).raise_for_status()
                        times.append(1000 * (time.perf_counter() - t))
                    calls = cost(r, lambda: c.get(path).raise_for_status())
                    print(f"{name:8} {first_ms:9.1f} {statistics.median(times):7.1f} {max(times):7.1f} "
                          f"{len(first.content):8d}  {sum(calls.values())} ({', '.join(f'{k} {v}' for k, v in sorted(calls.items()))})")
            r.close()
        finally:
            if gateway is not None:
                terminate(gateway, 10)
            server.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
