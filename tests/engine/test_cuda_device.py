"""An engine on cuda:N makes cuda:N the current device of every thread that runs it.

Triton launches on the calling thread's current device, and CUDA's current device
is per thread. No GPU here: torch.cuda.set_device / current_device are replaced by a
per-thread record, as CUDA keeps it.
"""
from __future__ import annotations

import threading

import pytest
import torch

from inferq.gpuworker.engine import llm_engine
from inferq.gpuworker.engine.llm_engine import LLMEngine
from tests.tiny_models import save_tiny_model


class PerThreadDevice:
    """CUDA's current device: one per thread, 0 until set; every set_device call recorded."""

    def __init__(self) -> None:
        self.local = threading.local()
        self.calls: list[tuple[str, torch.device]] = []

    def set_device(self, device) -> None:
        device = torch.device(device)
        self.calls.append((threading.current_thread().name, device))
        self.local.index = device.index

    def current_device(self) -> int:
        return getattr(self.local, "index", 0)

    def install(self, monkeypatch) -> None:
        monkeypatch.setattr(torch.cuda, "set_device", self.set_device)
        monkeypatch.setattr(torch.cuda, "current_device", self.current_device)


class StopBeforeLoading(Exception):
    pass


def test_engine_on_cuda_1_sets_the_device_before_it_loads_the_model(monkeypatch):
    cuda = PerThreadDevice()
    cuda.install(monkeypatch)
    seen = []

    def load_model(model, dtype, device, backend):
        seen.append((list(cuda.calls), device))
        raise StopBeforeLoading

    monkeypatch.setattr(llm_engine, "load_model", load_model)
    with pytest.raises(StopBeforeLoading):
        LLMEngine(device="cuda:1", attention_backend="torch", dtype="float32")
    calls, device = seen[0]
    assert calls == [("MainThread", torch.device("cuda", 1))] and device == torch.device("cuda", 1)


def test_engine_steps_from_another_thread_on_its_own_device(monkeypatch, tmp_path):
    engine = LLMEngine(model=str(save_tiny_model("llama", tmp_path / "llama")), device="cpu", dtype="float32",
                       num_kv_blocks=8, max_num_seqs=2)
    cuda = PerThreadDevice()
    cuda.install(monkeypatch)
    engine.device, engine._cuda = torch.device("cuda", 1), True  # as if built on cuda:1; an empty step touches no tensor

    def steps():
        engine.step()
        engine.step()

    loop = threading.Thread(target=steps, name="engine-loop")
    loop.start()
    loop.join()
    assert cuda.calls == [("engine-loop", torch.device("cuda", 1))]  # once: then it is that thread's device
