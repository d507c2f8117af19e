"""Where a Triton kernel can run, and facts about the device it runs on."""
from __future__ import annotations

import functools

import torch


def is_interpreted(kernel) -> bool:
    """True when ``triton.jit`` built the kernel for the CPU interpreter.

    That happens only if ``TRITON_INTERPRET=1`` was set before the module
    defining the kernel was imported.
    """
    return type(kernel).__name__ == "InterpretedFunction"


def check_launchable(kernel, tensor: torch.Tensor) -> None:
    if tensor.device.type == "cpu" and not is_interpreted(kernel):
        raise RuntimeError(
            "Triton kernels run on CPU only under the interpreter: set TRITON_INTERPRET=1 in the "
            "environment before importing kernels.* / inferq.gpuworker.attention.triton_backend "
            "(or use the 'torch' attention backend on CPU)"
        )
    if tensor.device.type not in ("cpu", "cuda"):
        raise RuntimeError(f"Triton kernels need CUDA (or CPU under TRITON_INTERPRET=1), got {tensor.device}")


@functools.lru_cache(maxsize=8)
def num_compute_units(device: torch.device) -> int:
    """Streaming multiprocessors of a CUDA device; an H100/H200-like 132 elsewhere.

    Used only to size grids (split-K), so the CPU interpreter plans exactly
    the way an H200 would.
    """
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 132
