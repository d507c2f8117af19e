"""Whether the C kernels run on several threads here, for the tests that need two: a skip only
where OpenMP cannot be had, naming the cause; a failure where it could but the kernels lack it.
``threads(n, *libs)`` sets torch and the given kernel libraries to n threads for a block (raw
ctypes calls and step programs do not sync their libraries themselves)."""
from __future__ import annotations

import functools
from contextlib import contextmanager

import pytest
import torch

from inferq.gpuworker.models import cpu_step_program
from inferq.kernels.cpu import loader


@functools.lru_cache(maxsize=None)
def missing() -> str | None:
    """Why the kernels run on one thread only here, or None where they are built with OpenMP."""
    lib = cpu_step_program.load()
    if lib is not None and lib.openmp:
        return None
    if not loader.enabled():
        return "INFERQ_CPU_KERNELS=0 turns the C kernels off"
    cc = loader.compiler()
    if cc is None:
        return "no C compiler on PATH (cc, gcc, clang or $CC): the C kernels cannot build"
    if not loader.openmp_flags(cc):
        return f"{cc} cannot build and link OpenMP (-fopenmp, libgomp): the C kernels run on one thread"
    raise AssertionError(f"{cc} builds OpenMP but the step program was built without it")


def needed():
    """A mark that skips a test, with the cause, where the kernels run on one thread only."""
    return pytest.mark.skipif(missing() is not None, reason=missing() or "")


def require() -> None:
    """Skip this test, with the cause ``missing`` names, where the kernels run on one thread only."""
    cause = missing()
    if cause is not None:
        pytest.skip(cause)


@contextmanager
def threads(n: int, *libs):
    """torch and these kernel libraries at n threads, back to torch's count before after."""
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    for lib in libs:
        loader.sync_threads(lib)
    try:
        yield
    finally:
        torch.set_num_threads(before)
        for lib in libs:
            loader.sync_threads(lib)
