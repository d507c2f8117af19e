"""Before the model loads: can the worker run on the device it resolves to?

An explicit ``INFERQ_DEVICE=cuda`` (or ``cuda:N``) where torch sees no usable GPU is refused
with the reason; only an unset device may fall back to the CPU. On CUDA with the Triton
attention backend, Triton compiles a small C launcher with the system C compiler against
Python.h the first time a kernel runs, that is under the first request, long after start; a
missing compiler or header is named here instead of failing every job then.
"""
from __future__ import annotations

import os
import shutil
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Optional


class DeviceUnusable(RuntimeError):
    """The worker cannot run on the device it was told to (or would) use."""


@dataclass(frozen=True)
class CudaFacts:
    """What torch knows about CUDA here: the CUDA version it was built for (None for a
    CPU-only build), whether a GPU is usable, and how many are visible."""

    built_for: Optional[str]
    available: bool
    count: int

    @classmethod
    def from_torch(cls) -> "CudaFacts":
        import torch

        available = torch.cuda.is_available()
        return cls(torch.version.cuda, available, torch.cuda.device_count() if available else 0)

    def unusable_reason(self, index: Optional[int]) -> Optional[str]:
        if self.built_for is None:
            return "this torch is a CPU-only build (install a CUDA wheel of torch)"
        if not self.available or self.count == 0:
            visible = os.environ.get("CUDA_VISIBLE_DEVICES")
            return (f"torch (built for CUDA {self.built_for}) sees no usable GPU: no NVIDIA driver, or no GPU given "
                    "to this container (docker: the NVIDIA Container Toolkit and a GPU device reservation)"
                    + (f"; CUDA_VISIBLE_DEVICES={visible!r}" if visible is not None else ""))
        if index is not None and index >= self.count:
            return f"cuda:{index} asked for, but only {self.count} GPU(s) are visible"
        return None


def c_compiler(env: Mapping[str, str]) -> Optional[str]:
    """The compiler Triton builds with (triton/runtime/build.py): $CC, else gcc, else clang
    on env's PATH; None where there is none."""
    path = env.get("PATH", "")
    if env.get("CC"):
        return shutil.which(env["CC"], path=path)
    return shutil.which("gcc", path=path) or shutil.which("clang", path=path)


def python_include_dir() -> str:
    """Where Triton looks for Python.h (the same scheme choice as triton/runtime/build.py)."""
    scheme = sysconfig.get_default_scheme()
    if scheme == "posix_local":  # Debian's scheme for the system Python
        scheme = "posix_prefix"
    return sysconfig.get_paths(scheme=scheme)["include"]


def missing_build_tools(env: Mapping[str, str] = os.environ, include_dir: Optional[str] = None) -> list[str]:
    """What Triton's launcher build lacks here, in words; empty when nothing is missing."""
    problems = []
    if c_compiler(env) is None:
        given = f"$CC={env['CC']!r} is not an executable, and " if env.get("CC") else ""
        problems.append(f"no C compiler ({given}neither gcc nor clang is on PATH; install gcc)")
    include = Path(include_dir or python_include_dir())
    if not (include / "Python.h").is_file():
        version = f"{sys.version_info.major}.{sys.version_info.minor}"
        problems.append(f"no Python.h in {include} (install python{version}-dev)")
    return problems


def check_device(requested: Optional[str], attention_backend: Optional[str], cuda: CudaFacts,
                 env: Mapping[str, str] = os.environ, include_dir: Optional[str] = None) -> str:
    """The device type the worker will run on ("cuda" or "cpu"); raises DeviceUnusable where
    it cannot. ``requested``: the device setting (None: cuda if usable, else cpu)."""
    if requested and requested.startswith("cuda"):
        index = int(requested.split(":", 1)[1]) if ":" in requested else None
        reason = cuda.unusable_reason(index)
        if reason:
            raise DeviceUnusable(f"INFERQ_DEVICE={requested} but CUDA is not usable: {reason}. "
                                 "Set INFERQ_DEVICE=cpu to run on the CPU on purpose.")
        on_cuda = True
    else:
        on_cuda = not requested and cuda.available
    if on_cuda and (attention_backend or "triton") == "triton":
        problems = missing_build_tools(env, include_dir)
        if problems:
            raise DeviceUnusable("on CUDA, Triton builds its kernel launcher with a C compiler against Python.h "
                                 "at the first request, and this machine has " + "; ".join(problems))
    return "cuda" if on_cuda else "cpu"
