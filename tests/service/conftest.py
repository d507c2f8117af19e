"""Fixtures for the worker service tests: a tiny model folder, the offline
engine as the oracle, and real worker subprocesses (python -m inferq.gpuworker.service)."""
from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.conftest import RedisServer
from tests.workers import WorkerProc


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> Path:
    from tests.tiny_models import save_tiny_model

    return save_tiny_model("llama", tmp_path_factory.mktemp("tiny") / "llama")


@pytest.fixture(scope="session")
def offline_llm(tiny_model):
    """The same engine in-process: what a queued job's output must equal."""
    import torch

    from inferq.gpuworker import LLM

    torch.set_num_threads(1)
    return LLM(model=str(tiny_model), dtype="float32", num_kv_blocks=512, max_num_seqs=64)


@pytest.fixture(scope="module")
def module_redis(tmp_path_factory):
    server = RedisServer(tmp_path_factory.mktemp("redis-svc")).start()
    yield server
    server.stop()


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


def paced_worker(module_redis, tiny_model, tmp_path_factory, model: str, worker_id: str):
    """A module's worker on the tiny model, paced at 10 ms per step: a 400-token job runs at
    least 4 s on any machine, so cancel and deadline tests always catch it mid-generation."""
    w = WorkerProc(module_redis.url, tiny_model, model, tmp_path_factory.mktemp("wlog"), worker_id,
                   "--step-pace-s", "0.01", metrics=True)
    w.wait_ready()
    yield w
    w.terminate()


def module_producer(module_redis, model: str):
    from inferq.producer import Producer

    prod = Producer(module_redis.url, default_model=model, max_backlog=1000)
    yield prod
    prod.close()
