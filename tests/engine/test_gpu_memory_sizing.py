"""KV cache sizing on CUDA counts everything in use on the device, not only this process's torch.

No GPU here: torch.cuda's memory calls are replaced by a fake device on which the
profiling forward allocates activations, torch caches and releases them, and a
CUDA context and other processes hold memory torch's allocator never sees.
"""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from inferq.gpuworker.config import EngineConfig
from inferq.gpuworker.engine import profiling
from inferq.gpuworker.engine.llm_engine import LLMEngine

GIB = 1024**3
SMOL = SimpleNamespace(num_layers=30, num_kv_heads=3, head_dim=64, vocab_size=49152)  # SmolLM2-135M
BYTES_PER_BLOCK = 2 * 30 * 16 * 3 * 64 * 2  # K and V of 16 tokens in bf16


class FakeGpu:
    """An 80 GiB device: this process's weights, a CUDA context, maybe other processes."""

    def __init__(self, others: int = 0, total: int = 80 * GIB, weights: int = 2 * GIB,
                 context: int = GIB // 2, activations: int = 3 * GIB) -> None:
        self.total, self.others, self.context, self.activations = total, others, context, activations
        self.allocated = self.reserved = self.peak = weights

    def profiling_forward(self, engine) -> None:
        self.peak = max(self.peak, self.allocated + self.activations)
        self.reserved = self.allocated + self.activations  # freed, but kept in torch's cache

    def empty_cache(self) -> None:
        self.reserved = self.allocated

    def reset_peak(self, device=None) -> None:
        self.peak = self.allocated

    def mem_get_info(self, device=None) -> tuple[int, int]:
        return self.total - self.context - self.others - self.reserved, self.total

    def install(self, monkeypatch) -> None:
        cuda = torch.cuda
        monkeypatch.setattr(cuda, "empty_cache", self.empty_cache)
        monkeypatch.setattr(cuda, "reset_peak_memory_stats", self.reset_peak)
        monkeypatch.setattr(cuda, "synchronize", lambda device=None: None)
        monkeypatch.setattr(cuda, "mem_get_info", self.mem_get_info)
        monkeypatch.setattr(cuda, "memory_allocated", lambda device=None: self.allocated)
        monkeypatch.setattr(cuda, "memory_reserved", lambda device=None: self.reserved)
        monkeypatch.setattr(cuda, "max_memory_allocated", lambda device=None: self.peak)
        monkeypatch.setattr(cuda, "get_device_properties", lambda device=None: SimpleNamespace(
            total_memory=self.total, multi_processor_count=132))
        monkeypatch.setattr(profiling, "peak_activation_bytes", self.profiling_forward)


def kv_blocks(monkeypatch, gpu: FakeGpu, **config) -> int:
    """What the engine sizes its KV cache to on this device (only the sizing runs)."""
    gpu.install(monkeypatch)
    engine = object.__new__(LLMEngine)
    engine.config = EngineConfig(**config)
    engine.device = torch.device("cuda", 0)
    engine._cuda = True
    engine.backend = SimpleNamespace(name="triton")
    engine.model_config = SMOL
    return engine._num_kv_blocks(SMOL, torch.bfloat16)


def test_another_process_on_the_gpu_shrinks_the_kv_cache_by_what_it_uses(monkeypatch):
    alone = kv_blocks(monkeypatch, FakeGpu())
    shared = kv_blocks(monkeypatch, FakeGpu(others=20 * GIB))
    assert abs((alone - shared) - 20 * GIB // BYTES_PER_BLOCK) <= 1


def test_the_budget_is_utilization_of_the_device_less_everything_in_use_and_the_step_peak(monkeypatch):
    gpu = FakeGpu()
    blocks = kv_blocks(monkeypatch, gpu, cuda_graphs=False, max_num_seqs=1)
    in_use = gpu.context + 2 * GIB  # context and weights; the activations were handed back
    sampler = 1 * SMOL.vocab_size * 20
    expected = (int(0.9 * 80 * GIB) - in_use - 3 * GIB - sampler) // BYTES_PER_BLOCK
    assert blocks == expected


def test_cuda_graphs_and_the_utilization_are_engine_settings_that_change_the_budget(monkeypatch):
    with_graphs = kv_blocks(monkeypatch, FakeGpu())
    without = kv_blocks(monkeypatch, FakeGpu(), cuda_graphs=False)
    assert without > with_graphs  # no graph pool to leave room for
    assert EngineConfig(enforce_eager=True).cuda_graphs_enabled() is False
    assert EngineConfig(cuda_graphs=False).cuda_graphs_enabled() is False
    half = kv_blocks(monkeypatch, FakeGpu(), gpu_memory_utilization=0.5)
    assert abs((with_graphs - half) - int(0.4 * 80 * GIB) // BYTES_PER_BLOCK) <= 1


def test_no_memory_left_for_the_kv_cache_is_a_clear_error(monkeypatch):
    with pytest.raises(RuntimeError) as error:
        kv_blocks(monkeypatch, FakeGpu(others=70 * GIB))
    message = str(error.value)
    assert "no GPU memory left for the KV cache on cuda:0" in message
    assert "72.00 GiB" in message and "72.50 GiB is in use" in message  # 0.9 x 80; 70 + 2 + 0.5
    assert "INFERQ_GPU_MEMORY_UTILIZATION" in message and "num_kv_blocks" in message
