"""`inferq up` with INFERQ_REDIS_URL pointing at a running Redis: it uses that
Redis (no embedded one), and on SIGTERM stops only what it started."""
import os
import signal
import subprocess
import sys
from pathlib import Path

import redis
from openai import OpenAI

from tests.cli.procs import LineReader, children_of, env_without, running
from tests.conftest import free_port

ROOT = Path(__file__).resolve().parents[2]


def test_up_uses_a_reachable_redis_and_leaves_it_running(stack, tmp_path):
    port = free_port()
    env = env_without("INFERQ_REDIS_URL", INFERQ_REDIS_URL=stack.url, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    proc = subprocess.Popen(
        [sys.executable, "-m", "producer.cli", "up", "--port", str(port), "--metrics-port", str(free_port()),
         "--model", str(stack.model_dir), "--served-model-name", "uptiny", "--device", "cpu",
         "--api-keys", "secret-1"],
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
        r = client.completions.create(model="uptiny", prompt="Hi", max_tokens=4, temperature=0)
        assert r.usage.completion_tokens >= 1
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=90) == 0, out.text()
        assert [p for p in kids if running(p)] == []
        assert redis.Redis.from_url(stack.url).ping()  # the external Redis is not ours to stop
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for pid in kids:
            if running(pid):
                os.kill(pid, signal.SIGKILL)
