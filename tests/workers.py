"""Real worker processes for the tests (``python -m inferq.gpuworker.service``): the one
launcher the service, reliability and gateway/CLI/Celery stacks share."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Optional

import redis

from inferq.schemas import keys
from inferq.processes import terminate
from tests.conftest import free_port

REPO = Path(__file__).resolve().parents[1]
SERVICE_DEFAULTS = ("--max-num-seqs", "32", "--num-kv-blocks", "512", "--lease-seconds", "1", "--block-ms", "200",
                    "--check-invariants")


class WorkerProc:
    """A real worker process; its log goes to a file the test can read.

    ``defaults`` are the flags the service tests run with (short lease, fast
    BLOCK, invariant checks); ``extra`` flags come after them and win.
    ``launcher``: what runs the worker (a wrapper script that takes the worker's
    flags after its own, e.g. ``("-m", "inferq.bench.ttft_trace", "worker", ...)``)."""

    def __init__(self, redis_url: str, model_folder: Path, served: str, log_dir: Path, worker_id: str,
                 *extra: str, metrics: bool = False, defaults: tuple = SERVICE_DEFAULTS,
                 launcher: tuple = ("-m", "inferq.gpuworker.service")):
        self.redis_url, self.served, self.worker_id = redis_url, served, worker_id
        self.metrics_port = free_port() if metrics else 0
        self.log_path = log_dir / f"worker-{worker_id}-{time.time_ns()}.log"
        args = [
            sys.executable, *launcher,
            "--redis-url", redis_url, "--model", str(model_folder), "--served-model-name", served,
            "--worker-id", worker_id, "--metrics-port", str(self.metrics_port), *defaults, *extra,
        ]
        env = dict(os.environ, OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false", PYTHONPATH=str(REPO))
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(args, cwd=REPO, env=env, stdout=self._log, stderr=subprocess.STDOUT)

    @property
    def pid(self) -> int:
        return self.proc.pid

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
        code = terminate(self.proc, timeout)
        self._log.close()
        return code
