"""Kernel tests run the Triton kernels compiled on a CUDA GPU, else interpreted on CPU.

``triton.jit`` chooses compiled vs interpreted when a kernel module is
imported, so TRITON_INTERPRET must be set before any ``kernels.*`` Triton
module is imported. pytest imports this conftest before the test modules of
this folder; if another folder's tests imported the kernels first, they are
re-imported here under the interpreter.
"""
from __future__ import annotations

import importlib
import os
import sys

import pytest
import torch

ON_GPU = torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1"
if not ON_GPU:
    os.environ["TRITON_INTERPRET"] = "1"
    # Re-import in dependency order so every module binds the interpreted kernels.
    for name in (
        "kernels.split_k_decode",
        "kernels.reshape_and_cache",
        "kernels.unified_attention",
        "gpuworker.attention.triton_backend",
    ):
        if name in sys.modules:
            importlib.reload(sys.modules[name])

DEVICE = torch.device("cuda" if ON_GPU else "cpu")


@pytest.fixture
def device() -> torch.device:
    return DEVICE
