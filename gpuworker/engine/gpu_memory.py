"""How much of a CUDA device the KV cache may take, as vLLM sizes it.

The budget is ``total x gpu_memory_utilization``. Subtracted from it, measured
after the profiling forward (the largest step the scheduler can make):

* everything in use on the device, by anyone (``torch.cuda.mem_get_info``):
  this process's weights and CUDA context, cuBLAS workspaces and other
  non-torch memory, and other processes sharing the GPU;
* the part of the forward's peak that torch has handed back since (every big
  step needs it again);
* a margin for what is allocated after sizing: the CUDA graphs' memory pool
  (a decode of the largest captured batch) and the sampler's temporaries.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

GIB = 1024**3
# Sampler temporaries per logit beyond the logits themselves: fp32 probabilities and
# log-probabilities, and a full top-p sort's fp32 values with their int64 indices.
SAMPLER_BYTES_PER_LOGIT = 4 + 4 + 4 + 8


@dataclass
class DeviceMemory:
    """What the profiling forward left on the device (bytes)."""

    total: int  # the device's memory
    free: int  # free on the device now, for anyone
    torch_reserved: int  # held by this process's caching allocator now
    torch_before: int  # allocated by this process before the forward (weights)
    torch_peak: int  # allocated at the forward's peak

    @property
    def in_use(self) -> int:
        return self.total - self.free

    @property
    def step_peak(self) -> int:
        """The forward's peak beyond what torch still holds (released memory it will need again)."""
        return max(0, self.torch_peak - self.torch_reserved)

    @property
    def activations(self) -> int:
        """The forward's own peak allocations (activations, logits, its scratch KV)."""
        return max(0, self.torch_peak - self.torch_before)


def profile_device_memory(device: torch.device, forward) -> DeviceMemory:
    """Run ``forward`` (the profiling step) and read the device afterwards."""
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(device)
    before = torch.cuda.memory_allocated(device)
    forward()
    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()  # what stays in use is then what the device really holds
    free, total = torch.cuda.mem_get_info(device)
    return DeviceMemory(
        total=total,
        free=free,
        torch_reserved=torch.cuda.memory_reserved(device),
        torch_before=before,
        torch_peak=torch.cuda.max_memory_allocated(device),
    )


def margin_bytes(memory: DeviceMemory, profiled_tokens: int, graph_batch: int, max_num_seqs: int,
                 vocab_size: int) -> int:
    """Graph pool (activations of the largest captured decode, 0 without graphs) plus
    sampler temporaries of a full batch."""
    graphs = memory.activations / max(1, profiled_tokens) * graph_batch  # activations grow with tokens
    return int(graphs) + max_num_seqs * vocab_size * SAMPLER_BYTES_PER_LOGIT


def kv_cache_budget(memory: DeviceMemory, utilization: float, margin: int, device: torch.device,
                    bytes_per_block: int) -> int:
    """Bytes the KV cache may take; a RuntimeError saying why when not even one block fits."""
    allowed = int(memory.total * utilization)
    budget = allowed - memory.in_use - memory.step_peak - margin
    if budget < bytes_per_block:
        raise RuntimeError(
            f"no GPU memory left for the KV cache on {device}: gpu_memory_utilization {utilization:g} of "
            f"{memory.total / GIB:.2f} GiB allows {allowed / GIB:.2f} GiB, but {memory.in_use / GIB:.2f} GiB "
            f"is in use on the device (this process's weights {memory.torch_before / GIB:.2f} GiB; the rest is "
            f"CUDA contexts, non-torch memory and other processes), the largest step needs "
            f"{memory.step_peak / GIB:.2f} GiB more and CUDA graphs and the sampler {margin / GIB:.2f} GiB; "
            f"one KV block needs {bytes_per_block} B. Raise INFERQ_GPU_MEMORY_UTILIZATION "
            f"(gpu_memory_utilization), free the GPU, lower max_num_batched_tokens / max_num_seqs, "
            f"or set num_kv_blocks / kv_cache_memory"
        )
    return budget
