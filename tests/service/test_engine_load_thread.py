"""The worker builds its engine on a thread of its own that has ended before serving starts,
so the main thread never holds an OpenMP pool beside the engine loop's (libgomp throttles
every team's spin-wait once its pools outnumber the CPUs: gpuworker/service/worker.py)."""
import threading

import pytest

from inferq.gpuworker.service import worker
from inferq.gpuworker.service.settings import WorkerSettings


def test_engine_is_built_on_a_thread_that_has_ended(monkeypatch):
    seen = {}

    def build(s):
        seen["thread"] = threading.current_thread()
        return "engine"

    monkeypatch.setattr(worker, "build_engine", build)
    assert worker.build_engine_on_its_own_thread(WorkerSettings(device="cpu")) == "engine"
    assert seen["thread"] is not threading.main_thread() and not seen["thread"].is_alive()


def test_a_load_that_fails_raises_on_the_caller(tmp_path):
    settings = WorkerSettings(model=str(tmp_path / "no-such-model"), device="cpu", torch_threads=1)
    with pytest.raises(Exception) as raised:
        worker.build_engine_on_its_own_thread(settings)
    with pytest.raises(type(raised.value)):
        worker.build_engine(settings)
