"""Small per-step host arrays (row indices, per-row parameters) moved to the device in
ONE copy that the host does not wait for.

``torch.tensor(list, device="cuda")`` is a blocking copy: the host waits until the
GPU has run everything queued before it (a sync), and a step that makes several
stalls the pipeline several times. ``Upload`` packs the arrays into one int64
buffer, pins it, copies it with ``non_blocking=True`` and cuts typed views on the
device; PyTorch's caching host allocator keeps the pinned block until its copy has
run. On CPU the arrays are wrapped as they are (no copy).

    up = Upload(device)
    rows = up.add([0, 2, 5], torch.int64)
    temps = up.add([0.7, 1.0, 0.9], torch.float32)
    up.send()
    rows.t, temps.t  # device tensors
"""
from __future__ import annotations

import numpy as np
import torch

_NUMPY_DTYPE = {torch.int64: np.int64, torch.int32: np.int32, torch.float32: np.float32, torch.bool: np.bool_}


class Staged:
    """One array of an ``Upload``: ``host`` at once, ``t`` (its device tensor) once sent."""

    __slots__ = ("host", "dtype", "t")

    def __init__(self, host: np.ndarray, dtype: torch.dtype):
        self.host, self.dtype, self.t = host, dtype, None


class Upload:
    def __init__(self, device: torch.device):
        self.device = torch.device(device)
        self._staged: list[Staged] = []

    def add(self, values, dtype: torch.dtype) -> Staged:
        staged = Staged(np.ascontiguousarray(values, dtype=_NUMPY_DTYPE[dtype]).reshape(-1), dtype)
        self._staged.append(staged)
        return staged

    def send(self) -> None:
        if self.device.type == "cpu":  # host memory already: no copy to save
            for s in self._staged:
                s.t = torch.from_numpy(s.host)
            return
        self._send_packed(lambda buf: buf.pin_memory().to(self.device, non_blocking=True))

    def _send_packed(self, move) -> None:
        """Pack every array into one int64 buffer, ``move`` it, and cut typed views."""
        words = [-(-s.host.nbytes // 8) for s in self._staged]  # each array starts 8-byte aligned
        starts = [8 * w for w in np.cumsum([0] + words[:-1]).tolist()]
        packed = np.empty(max(1, sum(words)), dtype=np.int64)
        host_bytes = packed.view(np.uint8)
        for s, start in zip(self._staged, starts):
            host_bytes[start : start + s.host.nbytes] = s.host.view(np.uint8)
        moved_bytes = move(torch.from_numpy(packed)).view(torch.uint8)
        for s, start in zip(self._staged, starts):
            s.t = moved_bytes[start : start + s.host.nbytes].view(s.dtype)
