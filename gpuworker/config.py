"""Engine configuration: every knob of one engine instance in one place."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch


@dataclass
class EngineConfig:
    model: Optional[str] = None  # HF folder, .gguf file, or None for the bundled SmolLM2
    served_model_name: Optional[str] = None
    attention_backend: Optional[str] = None  # None: "triton" on CUDA, "torch" elsewhere
    block_size: int = 16
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 2048
    max_model_len: Optional[int] = None
    enable_prefix_caching: bool = True
    enable_chunked_prefill: bool = True
    scheduling_policy: str = "fcfs"  # or "priority"
    num_kv_blocks: Optional[int] = None  # overrides the memory-based sizing
    kv_cache_memory: Optional[int] = None  # bytes for K+V of all layers
    gpu_memory_utilization: float = 0.9
    dtype: Optional[str] = None  # None: float32 on CPU, bfloat16 on CUDA
    device: Optional[str] = None  # None: cuda if available, else cpu
    enforce_eager: bool = False  # True: no CUDA graphs for decode steps

    # Default KV budget on CPU, where there is no memory profiling to do.
    CPU_KV_CACHE_BYTES = 2 * 1024**3

    def __post_init__(self):
        if self.block_size < 1 or self.block_size & (self.block_size - 1):
            raise ValueError(f"block_size must be a power of two, got {self.block_size}")
        if self.max_num_seqs < 1:
            raise ValueError("max_num_seqs must be at least 1")
        if self.max_num_batched_tokens < 1:
            raise ValueError("max_num_batched_tokens must be at least 1")
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ValueError("gpu_memory_utilization must be in (0, 1]")

    def resolved_device(self) -> torch.device:
        if self.device:
            return torch.device(self.device)
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")

    def resolved_dtype(self, device: torch.device) -> torch.dtype:
        if self.dtype:
            table = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
                     "fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
            if self.dtype not in table:
                raise ValueError(f"unknown dtype {self.dtype!r}; choose one of {sorted(table)}")
            return table[self.dtype]
        return torch.bfloat16 if device.type == "cuda" else torch.float32

    def resolved_backend(self, device: torch.device) -> str:
        if self.attention_backend:
            return self.attention_backend
        return "triton" if device.type == "cuda" else "torch"
