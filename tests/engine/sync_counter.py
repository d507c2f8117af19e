"""Counts, on CPU tensors, the calls that would make the host wait for a GPU.

There is no GPU in CI, and on CPU tensors nothing ever waits, so the counter
looks at the calls themselves (a ``TorchFunctionMode`` sees every torch function
and Tensor method, ``__bool__`` and ``tolist`` included):

* reads: calls that need a tensor's values on the host — ``item``, ``tolist``,
  ``bool()``/``int()``/``float()``/``__index__``, ``cpu``, ``numpy``, ``nonzero``,
  ``equal``, ``masked_select``, ``unique``, boolean-mask indexing,
  ``repeat_interleave`` with tensor repeats and no ``output_size``,
  one-argument ``where``;
* blocking uploads: tensors built from host data straight on a device
  (``torch.tensor(data, device=...)``), ``.to(device)`` without
  ``non_blocking=True`` (from pageable memory, a copy the host waits for), and
  indexing with a Python list (turned into a host tensor, then copied).

Each event is recorded with the engine file and line that made it, so a failing
count says where the sync is.
"""
from __future__ import annotations

import traceback

import torch
from torch.overrides import TorchFunctionMode

_READS = {
    "item", "tolist", "__bool__", "__int__", "__float__", "__index__", "cpu", "numpy", "nonzero", "argwhere",
    "equal", "allclose", "masked_select", "unique", "unique_consecutive", "bincount",
}
_INDEXING = {"__getitem__", "__setitem__", "index_put", "index_put_"}
_FACTORIES = {"tensor", "as_tensor", "asarray"}


def _has_bool_index(index) -> bool:
    items = index if isinstance(index, (tuple, list)) else (index,)
    return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in items)


def _has_list_index(index) -> bool:
    items = index if isinstance(index, tuple) else (index,)
    return any(isinstance(i, list) for i in items)


def _moves_to_a_device(args, kwargs) -> bool:
    targets = list(args[1:]) + [kwargs.get("device")]
    return any(isinstance(t, (str, torch.device, torch.Tensor)) for t in targets if t is not None)


class SyncCounter(TorchFunctionMode):
    def __init__(self) -> None:
        super().__init__()
        self.reads: list[str] = []
        self.blocking_uploads: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        if self._is_read(name, args, kwargs):
            self.reads.append(f"{name} at {_caller()}")
        elif self._is_blocking_upload(name, args, kwargs):
            self.blocking_uploads.append(f"{name} at {_caller()}")
        return func(*args, **kwargs)

    @staticmethod
    def _is_read(name, args, kwargs) -> bool:
        if name in _READS:
            return True
        if name in _INDEXING:
            return len(args) > 1 and _has_bool_index(args[1])
        if name == "repeat_interleave":
            repeats = args[1] if len(args) > 1 else kwargs.get("repeats", args[0] if args else None)
            return isinstance(repeats, torch.Tensor) and kwargs.get("output_size") is None
        return name == "where" and len(args) + len(kwargs) == 1

    @staticmethod
    def _is_blocking_upload(name, args, kwargs) -> bool:
        if name in _FACTORIES:
            return kwargs.get("device") is not None
        if name in _INDEXING:
            return len(args) > 1 and _has_list_index(args[1])
        if name in ("to", "cuda"):
            blocking = not kwargs.get("non_blocking", False) and True not in args[1:]
            return blocking and (name == "cuda" or _moves_to_a_device(args, kwargs))
        return False


def _caller() -> str:
    """The innermost frame in the engine's code (where the call was written)."""
    for frame in reversed(traceback.extract_stack()[:-2]):
        if "/gpuworker/" in frame.filename:
            return f"{frame.filename.rsplit('/gpuworker/', 1)[1]}:{frame.lineno}"
    return "outside the engine"
