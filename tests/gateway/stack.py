"""One real service stack for the gateway, CLI and Celery tests: a private
redis-server and one worker process on a tiny random Llama (served as "tiny"),
started once per test session and shared (starting a worker costs seconds).

Plus helpers to run a gateway app in-process on a free port.
"""
from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Optional

import redis

from schemas import keys
from tests.conftest import RedisServer, free_port

TINY = "tiny"
ROOT = Path(__file__).resolve().parents[2]


class Stack:
    def __init__(self, tmp: Path):
        self.tmp = tmp
        (tmp / "redis").mkdir(parents=True)
        self.redis = RedisServer(tmp / "redis").start()
        self.url = self.redis.url
        self.model_dir: Optional[Path] = None
        self.worker: Optional[subprocess.Popen] = None
        self.metrics_port = free_port()
        self.worker_log = tmp / "worker.log"

    def start_worker(self, timeout: float = 240.0) -> None:
        import torch

        torch.set_num_threads(1)
        from tests.tiny_models import save_tiny_model

        # Room for long generations (the 429 and disconnect tests need a job that runs a while).
        self.model_dir = save_tiny_model("llama", self.tmp / "tiny-llama", max_position_embeddings=4096)
        env = {**os.environ, "INFERQ_REDIS_URL": self.url, "OMP_NUM_THREADS": "1",
               "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
        args = [sys.executable, "-m", "gpuworker.service", "--model", str(self.model_dir),
                "--served-model-name", TINY, "--device", "cpu", "--metrics-port", str(self.metrics_port),
                "--max-num-seqs", "16", "--lease-seconds", "5", "--drain-timeout", "5"]
        self.worker = subprocess.Popen(args, env=env, stdout=open(self.worker_log, "wb"), stderr=subprocess.STDOUT)
        r = redis.Redis.from_url(self.url)
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if self.worker.poll() is not None:
                raise RuntimeError(f"worker exited ({self.worker.returncode}):\n{self.worker_log.read_text()[-3000:]}")
            if r.zcount(keys.workers(TINY), time.time() - 15, "+inf"):
                return
            time.sleep(0.2)
        raise RuntimeError(f"worker did not heartbeat within {timeout}s:\n{self.worker_log.read_text()[-3000:]}")

    def stop(self) -> None:
        if self.worker and self.worker.poll() is None:
            self.worker.send_signal(signal.SIGTERM)
            try:
                self.worker.wait(20)
            except subprocess.TimeoutExpired:
                self.worker.kill()
                self.worker.wait()
        self.redis.stop()


_stack: Optional[Stack] = None


def shared_stack(tmp_path_factory) -> Stack:
    """The session's stack, started on first use."""
    global _stack
    if _stack is None:
        s = Stack(tmp_path_factory.mktemp("stack"))
        try:
            s.start_worker()
        except Exception:
            s.stop()
            raise
        _stack = s
    return _stack


def stop_shared_stack() -> None:
    global _stack
    if _stack is not None:
        _stack.stop()
        _stack = None


@contextlib.contextmanager
def running_gateway(redis_url: str, producer: Optional[dict] = None, **gateway):
    """A gateway app served by uvicorn in a thread, on a free port; yields its base URL."""
    import uvicorn

    from producer.gateway import create_app
    from producer.gateway.config import GatewaySettings
    from producer.settings import ProducerSettings

    port = free_port()
    settings = GatewaySettings(host="127.0.0.1", port=port, keepalive_s=1.0, **gateway)
    app = create_app(settings, ProducerSettings(redis_url=redis_url, **(producer or {})))
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning",
                                           timeout_graceful_shutdown=2))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    end = time.monotonic() + 20
    while not server.started:
        if time.monotonic() > end or not thread.is_alive():
            raise RuntimeError("gateway did not start")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)
