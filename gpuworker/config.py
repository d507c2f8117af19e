"""Engine configuration: every knob of one engine instance in one place."""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Optional

import torch

_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
           "fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


@functools.lru_cache(maxsize=1)
def cpu_bf16_support() -> Optional[str]:
    """The CPU feature that makes bfloat16 matmuls fast here ("amx_bf16" or
    "avx512_bf16"), or None. Read from /proc/cpuinfo (Linux); without it (other
    systems) None, so they fall back to float32."""
    from inferq.gpuworker.attention import cpu_kernels  # the one reader of /proc/cpuinfo

    return next((f for f in ("amx_bf16", "avx512_bf16") if cpu_kernels.cpu_has(f)), None)


def default_dtype(device: torch.device) -> tuple[torch.dtype, str]:
    """The dtype used when none is asked for, and why (for the log and doctor)."""
    if device.type == "cuda":
        return torch.bfloat16, "CUDA device"
    if device.type == "cpu":
        feature = cpu_bf16_support()
        if feature:
            return torch.bfloat16, f"CPU has {feature}"
        return torch.float32, "CPU lacks AVX512-BF16/AMX"
    return torch.float32, f"{device.type} device"


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
    # CUDA: the share of the whole device this engine plans for; what anything else on the
    # device uses (other processes included) comes out of it (gpuworker/engine/gpu_memory.py).
    gpu_memory_utilization: float = 0.9
    dtype: Optional[str] = None  # None: bfloat16 on CUDA and on CPUs with AVX512-BF16/AMX, else float32
    device: Optional[str] = None  # None: cuda if available, else cpu
    enforce_eager: bool = False  # True: no CUDA graphs for decode steps (vLLM's name)
    cuda_graphs: bool = True  # False: the same as enforce_eager=True (the worker's INFERQ_CUDA_GRAPHS)
    # A request's tokens do not depend on the requests beside it, its prompt's chunking or the CUDA
    # graph size: on the Triton backend, fixed-size split-K segments and one tile shape, Triton
    # matmuls and RMSNorm instead of cuBLAS/torch reductions (docs/kernels.md, "Batch invariance
    # (GPU)"). On by default: the queue's promise that a migrated or regenerated job gives the same
    # tokens rests on it. False trades that for throughput on a GPU; the CPU kernels are invariant
    # either way.
    batch_invariant: bool = True
    # CPU: prepack matmul weights once at load, in place of the plain ones, for our kernels (fp32,
    # bf16 with AMX or AVX512-BF16; gpuworker/models/cpu_linear.py) or oneDNN (bf16). None/True:
    # where it works.
    prepack_weights: Optional[bool] = None
    # CPU: small C kernels (paged decode attention without the KV gather; rotary; fused
    # residual add + RMSNorm in bfloat16), compiled once with the system C compiler into
    # ~/.cache/inferq/cpu_kernels (inferq_kernels/cpu/loader.py); OpenMP inside, on torch's thread
    # count. None/True: where they build; False (or INFERQ_CPU_KERNELS=0): torch only.
    cpu_kernels: Optional[bool] = None
    # Structured outputs: compiled grammars kept per process (LRU; a deep copy per request).
    grammar_cache_size: int = 256
    # Speculative decoding (gpuworker/engine/speculative/): None = off; a dict / JSON
    # string / SpeculativeConfig, e.g. {"method": "ngram", "k": 4}.
    speculative: Optional[object] = None
    # Reasoning models (vLLM's --reasoning-parser): "auto" (on when the chat template knows
    # <think>), "none", "qwen3" or "deepseek_r1". On, a structured-output constraint applies
    # to what follows the reasoning (engine/grammar.py, ReasoningGate).
    reasoning_parser: str = "auto"
    # Embeddings (engine/pooling.py): how a prompt's final hidden states become one vector
    # when the request does not say: "last" (the last token, as decoder-only embedding
    # models are trained) or "mean" (over every prompt position).
    pooling: str = "last"
    # Weights of an HF folder quantized at load (gpuworker/models/weight_quantization.py): None,
    # "int8" or "int4" (CPU: Q8_0 / Q4_0 blocks on the quantized CPU kernels; CUDA: the weight-only
    # Triton matmul) or "fp8" (CUDA: e4m3 with a scale per output channel). A GGUF file's weights
    # are already quantized and run as stored.
    quantization: Optional[str] = None

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
        if self.reasoning_parser.strip().lower() != "auto":
            from inferq.schemas.reasoning import reasoning_format

            reasoning_format(self.reasoning_parser)  # ValueError naming the families
        if self.quantization is not None:
            from inferq.gpuworker.models.weight_quantization import check_method

            check_method(self.quantization)
        if self.pooling not in ("mean", "last"):
            raise ValueError(f"pooling must be 'mean' or 'last', got {self.pooling!r}")
        if self.speculative is not None:
            from inferq.gpuworker.engine.speculative.config import SpeculativeConfig

            self.speculative = SpeculativeConfig.parse(self.speculative)  # a clear error at construction

    def cuda_graphs_enabled(self) -> bool:
        return self.cuda_graphs and not self.enforce_eager

    def resolved_device(self) -> torch.device:
        if self.device:
            return torch.device(self.device)
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")

    def resolved_dtype(self, device: torch.device) -> torch.dtype:
        return self.resolved_dtype_and_reason(device)[0]

    def resolved_dtype_and_reason(self, device: torch.device) -> tuple[torch.dtype, str]:
        if self.dtype and self.dtype != "auto":
            if self.dtype not in _DTYPES:
                raise ValueError(f"unknown dtype {self.dtype!r}; choose one of {sorted(_DTYPES)} or auto")
            return _DTYPES[self.dtype], "asked for"
        return default_dtype(device)

    def resolved_backend(self, device: torch.device) -> str:
        if self.attention_backend:
            return self.attention_backend
        return "triton" if device.type == "cuda" else "torch"
