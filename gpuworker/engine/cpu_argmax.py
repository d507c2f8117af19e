"""Greedy argmax of CPU logits in C (inferq_kernels/cpu/greedy_argmax.c): one vectorised pass for
each row's maximum, one for its first position. torch's argmax reduces element by element,
tens of microseconds a row on a 49,152-token vocabulary. Same answers as
``torch.argmax``, ties and NaN included."""
from __future__ import annotations

import ctypes
import functools
from typing import Optional

import torch

from inferq.kernels.cpu import loader

# no -ffast-math family: the NaN tests must stay
_FLAGS = ["-O3", "-march=native", "-std=c11"]


@functools.lru_cache(maxsize=None)
def load() -> Optional[ctypes.CDLL]:
    """The built library, or None (no compiler, ``INFERQ_CPU_KERNELS=0``)."""
    lib = loader.build("greedy_argmax", _FLAGS) if loader.enabled() else None
    if lib is not None:
        p, i = ctypes.c_void_p, ctypes.c_int64
        lib.fns = {}
        for dt, name in ((torch.float32, "argmax_rows_f32"), (torch.bfloat16, "argmax_rows_bf16")):
            fn = getattr(lib, name)
            fn.argtypes, fn.restype = [p, i, i, i, p], ctypes.c_int
            lib.fns[dt] = fn
    return lib


def argmax_rows(logits: torch.Tensor) -> Optional[torch.Tensor]:
    """int64 ``[rows]``: each row's argmax, for a 2-D float32 / bfloat16 CPU tensor with unit
    column stride; None where the kernel does not apply (the caller keeps torch's)."""
    lib = load()
    if (lib is None or logits.device.type != "cpu" or logits.dim() != 2 or logits.stride(-1) != 1
            or logits.shape[1] < 1):
        return None
    fn = lib.fns.get(logits.dtype)
    if fn is None:
        return None
    rows, n = logits.shape
    out = torch.empty(rows, dtype=torch.int64)
    if rows:
        loader.sync_threads(lib)
        if fn(logits.data_ptr(), logits.stride(0), rows, n, out.data_ptr()) != 0:
            return None
    return out
