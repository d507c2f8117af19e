"""The main job: `inferq up` on embedded defaults (no INFERQ_REDIS_URL), used
through the official openai client, then stopped with SIGINT leaving nothing
running. Loads the bundled SmolLM2-135M-Instruct on CPU."""
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import redis
from openai import OpenAI

from inferq.schemas import keys
from tests.cli.procs import LineReader, children_of, env_without, running
from tests.conftest import free_port

ROOT = Path(__file__).resolve().parents[2]


def inferq_cmd() -> list[str]:
    exe = shutil.which("inferq")
    return [exe] if exe else [sys.executable, "-m", "inferq.cli"]


def wait_for_worker_metrics(url: str, samples: int = 600) -> dict:
    """The dashboard's worker row once the gateway's sampler has read the worker's
    /metrics (it samples on its own clock: poll the observed state, bounded by count)."""
    rows = []
    for _ in range(samples):
        rows = httpx.get(f"{url}/dashboard/api/workers", timeout=10).json()["data"]
        ready = [r for r in rows if (r.get("metrics") or {}).get("config")]
        if ready:
            return ready[0]
        time.sleep(0.1)
    raise AssertionError(f"the dashboard never showed the worker's metrics: {rows}")


@pytest.mark.slow
def test_inferq_up_serves_openai_and_stops_cleanly_on_sigint(tmp_path):
    port, redis_port, metrics_port = free_port(), free_port(), free_port()
    env = env_without("INFERQ_REDIS_URL", OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    proc = subprocess.Popen(
        [*inferq_cmd(), "up", "--port", str(port), "--redis-port", str(redis_port),
         "--metrics-port", str(metrics_port), "--ready-timeout", "400"],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    out = LineReader(proc.stdout)
    kids: set[int] = set()
    try:
        ready = out.wait_for("READY ", timeout=420)
        url = ready.split()[1]
        assert url == f"http://127.0.0.1:{port}"
        assert "embedded Redis" in out.text()  # INFERQ_REDIS_URL unset: the bundled redis-server
        assert f"{url}/v1/chat/completions" in out.text()  # the ready-to-paste example
        # READY is printed only once the gateway's readiness answer says so.
        ready_now = httpx.get(f"{url}/ready", timeout=10)
        assert ready_now.status_code == 200 and ready_now.json()["status"] == "ready", ready_now.text
        kids = children_of(proc.pid)
        assert len(kids) >= 3  # redis-server, worker, gateway
        # The embedded Redis has a random password of its own, kept off every command line.
        password = (tmp_path / ".inferq" / "redis" / "password").read_text().strip()
        assert len(password) >= 20
        with pytest.raises(redis.AuthenticationError):
            redis.Redis(port=redis_port).ping()
        assert redis.Redis(port=redis_port, password=password).ping()
        for pid in kids:
            assert password.encode() not in Path(f"/proc/{pid}/cmdline").read_bytes()
        assert password not in out.text()  # the banner reads it from the file: $(cat ...)

        client = OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0, timeout=300)
        messages = [{"role": "user", "content": "What is the capital of France?"}]
        whole = client.chat.completions.create(model=keys.DEFAULT_MODEL, messages=messages, max_tokens=24,
                                               temperature=0)
        answer = whole.choices[0].message.content
        assert answer and whole.choices[0].finish_reason in ("stop", "length")
        assert "Paris" in answer  # the real model, not noise
        chunks = list(client.chat.completions.create(model=keys.DEFAULT_MODEL, messages=messages, max_tokens=24,
                                                     temperature=0, stream=True))
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == answer

        # /dashboard reads the worker `up` started, with no flag: its row carries live engine metrics.
        assert httpx.get(f"{url}/dashboard", timeout=10).status_code == 200
        row = wait_for_worker_metrics(url)
        assert row["alive"] and row["metrics"]["metrics_url"] == f"http://127.0.0.1:{metrics_port}/metrics"
        assert int(row["metrics"]["config"]["num_kv_blocks"]) > 0 and 0 <= row["metrics"]["kv_cache_usage"] <= 1
        assert row["metrics"]["running"] == 0  # both requests finished

        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=90) == 0, out.text()
        time.sleep(0.2)
        left = [pid for pid in kids if running(pid)]
        assert left == [], f"still running after SIGINT: {left}"
        assert "stopped" in out.text()
        # The embedded Redis kept its data with AOF on, in the local folder.
        assert list((tmp_path / ".inferq" / "redis").glob("appendonly*")), "no AOF file"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for pid in kids:  # never leave a stray server behind, even on failure
            if running(pid):
                os.kill(pid, signal.SIGKILL)
