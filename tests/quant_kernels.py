"""Whether the quantized CPU kernels (gpuworker/models/quant_linear.py) are here, for the tests
that need them: a skip only where they cannot build, a failure where they could but did not."""
from __future__ import annotations

import pytest

from inferq.gpuworker.models import quant_linear as ql
from inferq.kernels.cpu import loader

MISSING = ("the quantized CPU kernels cannot build here (no C compiler, no AVX2 + FMA + F16C, "
           "or INFERQ_CPU_KERNELS=0)")


def available() -> bool:
    if ql.load() is not None:
        return True
    assert not loader.enabled() or loader.compiler() is None or ql.best_isa() is None, \
        "a C compiler and AVX2 are here but the quantized CPU kernels did not build"
    return False


def require():
    """The kernels' library, or this test skipped for the reason in ``MISSING``."""
    if not available():
        pytest.skip(MISSING)
    return ql.load()
