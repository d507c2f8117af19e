"""`inferq bench ttft-trace` against a real worker (tiny random Llama, private
redis-server): every measured job has each point of its path, in causal order,
and the reports run. Asserts presence and order, never durations; it also
catches a renamed method the trace wraps (the worker would run untraced)."""
from __future__ import annotations

import json

import pytest

from inferq.bench import ttft_trace
from inferq.bench.cli import main as bench_main
from tests.workers import WorkerProc

SERVED, WORKER_ID, N = "tiny-trace", "trace-1", 4


@pytest.mark.timeout(600)
def test_trace_has_each_point_in_order(redis_url, tiny_model_folder, tmp_path, capsys):
    trace_path, result_path = tmp_path / "trace.json", tmp_path / "serve.json"
    launcher = ("-m", "inferq.bench.ttft_trace", "worker", "--trace-out", str(trace_path), "--")
    worker = WorkerProc(redis_url, tiny_model_folder, SERVED, tmp_path, WORKER_ID, "--device", "cpu",
                        launcher=launcher)
    try:
        worker.wait_ready()
        rc = bench_main(["serve", "--backend", "redis", "--redis-url", redis_url, "--model", SERVED,
                         "--num-prompts", str(N), "--random-input-len", "16", "--random-output-len", "4",
                         "--request-rate", "50", "--num-warmups", "1", "--no-progress", "--no-figure", "--seed", "1",
                         "--result-file", str(result_path)])
        assert rc == 0, capsys.readouterr().out
    finally:
        assert worker.terminate(60) == 0, worker.log()[-3000:]  # the trace is written at exit

    trace, result = json.loads(trace_path.read_text()), json.loads(result_path.read_text())
    jobs = [v for v in trace["jobs"].values() if "created" in v]
    assert len(jobs) == N + 1  # the warm-up job too
    order = ("created", "read", "admit0", "add", "sched0", "token", "pub0", "pub1")
    for v in jobs:
        point = {**trace["jobs"]["entry:" + v["entry"]], **v}
        times = [point[p] for p in order]
        assert times == sorted(times), dict(zip(order, times))  # each happens after the one before
        assert point["admit0"] <= point["admit1"]
    # Every step ended before the next began, and each job was first scheduled in exactly one step.
    steps = trace["steps"]
    assert all(a[1] <= b[0] for a, b in zip(steps, steps[1:]))
    firsts = [rid for s in steps for rid in s[5]]
    assert sorted(firsts) == sorted(k for k, v in trace["jobs"].items() if "created" in v)

    text = ttft_trace.report(trace, result)
    assert f"{N} requests" in text and "TTFT (client)" in text and "steps with a prompt" in text
    assert "TTFT median" in ttft_trace.client_steps(result)
