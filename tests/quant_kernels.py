"""Whether the quantized CPU kernels (gpuworker/models/quant_linear.py) are here, for the tests
that need them: a skip only where they cannot build, naming the cause; a failure where they
could but did not."""
from __future__ import annotations

import functools

import pytest

from inferq.gpuworker.models import quant_linear as ql
from inferq.kernels.cpu import loader


@functools.lru_cache(maxsize=None)
def missing() -> str | None:
    """Why the kernels cannot build here, or None where they are built."""
    if ql.load() is not None:
        return None
    if not loader.enabled():
        return "INFERQ_CPU_KERNELS=0 turns the C kernels off: the quantized CPU kernels are not built"
    if loader.compiler() is None:
        return "no C compiler on PATH (cc, gcc, clang or $CC): the quantized CPU kernels cannot build"
    if ql.best_isa() is None:
        return "this CPU lacks AVX2 + FMA + F16C: the quantized CPU kernels have no build for it"
    raise AssertionError("a C compiler and AVX2 are here but the quantized CPU kernels did not build")


def available() -> bool:
    return missing() is None


def needed():
    """A mark that skips a test, with the cause, where the kernels cannot build."""
    return pytest.mark.skipif(not available(), reason=missing() or "")


def require():
    """The kernels' library, or this test skipped for the cause ``missing`` names."""
    cause = missing()
    if cause is not None:
        pytest.skip(cause)
    return ql.load()
