"""Fixtures for the worker service tests: a tiny model folder, the offline
engine as the oracle, and real worker subprocesses (python -m gpuworker.service)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Optional

import pytest
import redis

from schemas import keys
from tests.conftest import RedisServer

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> Path:
    from tests.tiny_models import save_tiny_model

    return save_tiny_model("llama", tmp_path_factory.mktemp("tiny") / "llama")


@pytest.fixture(scope="session")
def offline_llm(tiny_model):
    """The same engine in-process: what a queued job's output must equal."""
    import torch

    from gpuworker import LLM

    torch.set_num_threads(1)
    return LLM(model=str(tiny_model), dtype="float32", num_kv_blocks=512, max_num_seqs=64)


@pytest.fixture(scope="module")
def module_redis(tmp_path_factory):
    server = RedisServer(tmp_path_factory.mktemp("redis-svc")).start()
    yield server
    server.stop()


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class WorkerProc:
    """A real worker process; its log goes to a file the test can read."""

    def __init__(self, redis_url: str, model_folder: Path, served: str, log_dir: Path, worker_id: str,
                 *extra: str, metrics: bool = False):
        self.redis_url, self.served, self.worker_id = redis_url, served, worker_id
        self.metrics_port = free_port() if metrics else 0
        self.log_path = log_dir / f"worker-{worker_id}-{time.time_ns()}.log"
        args = [
            sys.executable, "-m", "gpuworker.service",
            "--redis-url", redis_url, "--model", str(model_folder), "--served-model-name", served,
            "--worker-id", worker_id, "--max-num-seqs", "32", "--num-kv-blocks", "512",
            "--lease-seconds", "1", "--block-ms", "200", "--metrics-port", str(self.metrics_port),
            "--check-invariants", *extra,
        ]
        env = dict(os.environ, OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false", PYTHONPATH=str(REPO))
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(args, cwd=REPO, env=env, stdout=self._log, stderr=subprocess.STDOUT)

    def wait_ready(self, timeout: float = 180) -> "WorkerProc":
        """Ready once its heartbeat is in the workers set of its model."""
        r = redis.Redis.from_url(self.redis_url)
        end = time.time() + timeout
        try:
            while time.time() < end:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"worker exited with {self.proc.returncode}:\n{self.log()[-3000:]}")
                if r.zscore(keys.workers(self.served), self.worker_id) is not None:
                    return self
                time.sleep(0.1)
        finally:
            r.close()
        raise TimeoutError(f"worker not ready in {timeout}s:\n{self.log()[-3000:]}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def metrics(self) -> dict[str, float]:
        """Scrape /metrics into {'name{labels}': value}."""
        text = urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5).read().decode()
        out = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                k, _, v = line.rpartition(" ")
                out[k] = float(v)
        return out

    def metric(self, name: str, **labels) -> float:
        """Sum of a metric's samples whose labels include ``labels``."""
        total = 0.0
        for k, v in self.metrics().items():
            base, _, rest = k.partition("{")
            if base == name and all(f'{lk}="{lv}"' in rest for lk, lv in labels.items()):
                total += v
        return total

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def terminate(self, timeout: float = 60) -> Optional[int]:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        return self.proc.returncode


@pytest.fixture
def start_worker(tmp_path):
    """Start worker processes; every one still running at the end is stopped."""
    procs: list[WorkerProc] = []

    def start(redis_url, model_folder, served, worker_id, *extra, metrics=False, wait=True) -> WorkerProc:
        w = WorkerProc(redis_url, model_folder, served, tmp_path, worker_id, *extra, metrics=metrics)
        procs.append(w)
        return w.wait_ready() if wait else w

    yield start
    for w in procs:
        w.kill()
        w.terminate()


def wait_for(pred, timeout: float = 30, interval: float = 0.05, what: str = "condition"):
    end = time.time() + timeout
    while time.time() < end:
        v = pred()
        if v:
            return v
        time.sleep(interval)
    raise TimeoutError(f"timed out waiting for {what}")
