"""`inferq doctor` against a worker that really runs out of KV blocks: a
worker with a tiny KV cache, more work than fits, and the doctor, reading
its live metrics, names the KV cache and says what to change."""
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

from producer import Producer
from schemas import keys
from tests.cli.procs import env_without
from tests.conftest import free_port

ROOT = Path(__file__).resolve().parents[2]
MODEL = "kvtight"


def test_doctor_names_kv_cache_when_blocks_run_out(stack, tmp_path):
    metrics_port = free_port()
    env = env_without("INFERQ_REDIS_URL", INFERQ_REDIS_URL=stack.url, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    worker = subprocess.Popen(
        [sys.executable, "-m", "gpuworker.service", "--model", str(stack.model_dir), "--served-model-name", MODEL,
         "--device", "cpu", "--metrics-port", str(metrics_port), "--num-kv-blocks", "12", "--max-model-len", "160",
         "--max-num-seqs", "16", "--drain-timeout", "2"],
        env=env, stdout=open(tmp_path / "worker.log", "wb"), stderr=subprocess.STDOUT)
    p = Producer(stack.url)
    try:
        end = time.monotonic() + 240
        while not p.workers(MODEL):
            assert worker.poll() is None and time.monotonic() < end, (tmp_path / "worker.log").read_text()[-2000:]
            time.sleep(0.2)
        # 16 jobs x ~130 tokens against 12 blocks x 16 = 192 tokens of KV cache.
        handles = [p.submit(f"Job number {i} says", model=MODEL, sampling={"max_tokens": 120, "ignore_eos": True})
                   for i in range(16)]
        r = subprocess.run(
            [sys.executable, "-m", "producer.cli", "doctor", "--metrics-url",
             f"http://127.0.0.1:{metrics_port}/metrics", "--interval", "2", "--json"],
            env=env, capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        report = json.loads(r.stdout)
        assert report["bottleneck"] == "kv_cache", report
        assert report["readings"]["num_kv_blocks"] == 12
        assert "--num-kv-blocks 18" in report["findings"][0]["advice"]
        for h in handles:
            h.cancel()
    finally:
        worker.send_signal(signal.SIGTERM)
        try:
            worker.wait(30)
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait()
        p.redis.delete(keys.jobs(MODEL), keys.workers(MODEL), keys.dlq(MODEL))
