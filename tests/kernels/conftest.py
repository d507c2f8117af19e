"""Kernel tests run the Triton kernels compiled on a CUDA GPU, else interpreted on CPU.

Triton reads TRITON_INTERPRET when ``triton.language`` and each ``@triton.jit``
kernel are defined, so it must be set before triton is first imported.
pytest imports this conftest while collecting, before any test runs, so in a
normal session triton is first imported after this file sets it. If triton
was imported earlier without it, this fails with a clear message instead of
letting the kernels crash later (re-importing triton in-process aborts).
"""
from __future__ import annotations

import os
import sys

import pytest
import torch

ON_GPU = torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1"


def _triton_is_interpreting() -> bool:
    # triton.language's own helpers (tl.sum, tl.cdiv, ...) are jit functions
    # too, built when triton.language was first imported.
    import triton.language as tl

    return type(tl.cdiv).__name__ == "InterpretedFunction"


if not ON_GPU:
    if "triton" in sys.modules and os.environ.get("TRITON_INTERPRET") != "1" and not _triton_is_interpreting():
        raise RuntimeError(
            "triton was imported before tests/kernels/conftest.py could set TRITON_INTERPRET=1 "
            "(torch._dynamo imports it when transformers runs a model); run with TRITON_INTERPRET=1 "
            "in the environment, or set it in tests/conftest.py before anything imports torch"
        )
    os.environ["TRITON_INTERPRET"] = "1"

DEVICE = torch.device("cuda" if ON_GPU else "cpu")


@pytest.fixture
def device() -> torch.device:
    return DEVICE
