"""Where a Triton kernel can run, facts about the device it runs on, and how launches are built."""
from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from pathlib import Path

import torch


def triton_cache_dir() -> str:
    """Where Triton keeps compiled kernels: $TRITON_CACHE_DIR, else ``triton`` under
    inferq's cache root ($INFERQ_CACHE_DIR or ~/.cache/inferq, beside the CPU kernels
    and GGUF conversions: one folder to keep on a volume)."""
    if os.environ.get("TRITON_CACHE_DIR"):
        return os.environ["TRITON_CACHE_DIR"]
    root = os.environ.get("INFERQ_CACHE_DIR") or Path.home() / ".cache" / "inferq"
    return str(Path(root) / "triton")


def use_persistent_triton_cache() -> str:
    """Point Triton at ``triton_cache_dir()`` unless TRITON_CACHE_DIR is set already.

    Triton reads the variable each time it compiles, so setting it before the
    first launch is enough; a restarted worker then loads its kernels from disk
    instead of compiling them again (1-3 s each)."""
    os.environ["TRITON_CACHE_DIR"] = triton_cache_dir()
    return os.environ["TRITON_CACHE_DIR"]


# Every Triton kernel module imports this one, so this runs before any kernel compiles.
use_persistent_triton_cache()


@dataclass(frozen=True)
class KernelLaunch:
    """One kernel launch, built apart from running it, so what Triton compiles it
    under can be checked without a GPU (``inferq.kernels.compile_key``)."""

    kernel: object  # a triton.jit function (or its interpreted twin)
    grid: tuple
    args: tuple
    kwargs: dict

    def run(self) -> None:
        self.kernel[self.grid](*self.args, **self.kwargs)


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
