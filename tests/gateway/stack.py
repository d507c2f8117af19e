"""One real service stack for the gateway, CLI and Celery tests: a private
redis-server and one worker process on a tiny random Llama (served as "tiny"),
started once per test session and shared (starting a worker costs seconds).

Plus helpers to run a gateway app in-process on a free port.
"""
from __future__ import annotations

import contextlib
import threading
import time
from pathlib import Path
from typing import Optional

from tests.conftest import RedisServer, free_port
from tests.workers import WorkerProc

TINY = "tiny"


class Stack:
    def __init__(self, tmp: Path):
        self.tmp = tmp
        (tmp / "redis").mkdir(parents=True)
        self.redis = RedisServer(tmp / "redis").start()
        self.url = self.redis.url
        self.model_dir: Optional[Path] = None
        self.worker: Optional[WorkerProc] = None
        self.metrics_port: Optional[int] = None

    def start_worker(self, timeout: float = 240.0) -> None:
        import torch

        torch.set_num_threads(1)
        from tests.tiny_models import save_tiny_model

        # Room for long generations (the 429 and disconnect tests need a job that runs a while).
        self.model_dir = save_tiny_model("llama", self.tmp / "tiny-llama", max_position_embeddings=4096)
        self.worker = WorkerProc(self.url, self.model_dir, TINY, self.tmp, "stack-worker", "--device", "cpu",
                                 "--max-num-seqs", "16", "--lease-seconds", "5", "--drain-timeout", "5",
                                 metrics=True, defaults=())
        self.metrics_port = self.worker.metrics_port
        self.worker.wait_ready(timeout)

    def stop(self) -> None:
        if self.worker is not None:
            self.worker.terminate(timeout=20)
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

    from inferq.producer.gateway import create_app
    from inferq.producer.gateway.config import GatewaySettings
    from inferq.producer.settings import ProducerSettings

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
