"""`inferq up` with INFERQ_REDIS_URL pointing at a running Redis: it uses that
Redis (no embedded one) and on SIGTERM stops only what it started.

Its worker is given a tiny KV cache (through --worker-arg), more work than fits
is queued, and `inferq doctor`, reading the live metrics, must name the KV
cache as the bottleneck and say what to change.
"""
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import redis
from openai import OpenAI

from inferq.producer import Producer
from tests.cli.procs import LineReader, children_of, env_without, running
from tests.conftest import free_port

ROOT = Path(__file__).resolve().parents[2]
MODEL = "uptiny"


def test_up_on_external_redis_and_doctor_finds_the_kv_limit(stack, tmp_path):
    port, metrics_port = free_port(), free_port()
    env = env_without("INFERQ_REDIS_URL", INFERQ_REDIS_URL=stack.url, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    proc = subprocess.Popen(
        [sys.executable, "-m", "inferq.cli", "up", "--port", str(port), "--metrics-port", str(metrics_port),
         "--model", str(stack.model_dir), "--served-model-name", MODEL, "--device", "cpu", "--api-keys", "secret-1",
         # 12 blocks x 16 tokens of KV cache: 16 jobs of ~130 tokens cannot all fit.
         "--worker-arg=--num-kv-blocks=12", "--worker-arg=--max-model-len=160", "--worker-arg=--max-num-seqs=16",
         "--worker-arg=--drain-timeout=2",
         # Paced (0.1 s a step): the 16 jobs are still running when doctor samples, on any machine.
         "--worker-arg=--step-pace-s=0.1"],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out = LineReader(proc.stdout)
    kids: set[int] = set()
    try:
        url = out.wait_for("READY ", timeout=300).split()[1]
        kids = children_of(proc.pid)
        assert "(from INFERQ_REDIS_URL)" in out.text() and "embedded" not in out.text()
        assert not (tmp_path / ".inferq" / "redis").exists()
        assert "Authorization: Bearer secret-1" in out.text()  # the example carries the key
        client = OpenAI(base_url=f"{url}/v1", api_key="secret-1", max_retries=0, timeout=120)
        r = client.completions.create(model=MODEL, prompt="Hi", max_tokens=4, temperature=0)
        assert r.usage.completion_tokens >= 1

        p = Producer(stack.url)
        handles = [p.submit(f"Job number {i} says", model=MODEL, sampling={"max_tokens": 120, "ignore_eos": True})
                   for i in range(16)]
        doc = subprocess.run(
            [sys.executable, "-m", "inferq.cli", "doctor", "--metrics-url",
             f"http://127.0.0.1:{metrics_port}/metrics", "--interval", "2", "--json"],
            env=env, capture_output=True, text=True, timeout=60)
        assert doc.returncode == 0, doc.stderr
        report = json.loads(doc.stdout)
        assert report["bottleneck"] == "kv_cache", report
        assert report["readings"]["num_kv_blocks"] == 12
        assert "--num-kv-blocks 18" in report["findings"][0]["advice"]
        for h in handles:
            h.cancel()

        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=90) == 0, out.text()
        assert [pid for pid in kids if running(pid)] == []
        assert redis.Redis.from_url(stack.url).ping()  # the external Redis is not ours to stop
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for pid in kids:
            if running(pid):
                os.kill(pid, signal.SIGKILL)
