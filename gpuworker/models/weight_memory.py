"""Bytes a model's tensors hold, against one plain copy of its weights (the check that
CPU prepacking replaces the weights rather than adding a second copy)."""
from __future__ import annotations

import torch
from torch import nn


def held_bytes(module: nn.Module) -> int:
    """Bytes of every parameter and buffer, each storage counted once (tied weights, views)."""
    seen: set[int] = set()
    total = 0
    for t in [*module.parameters(), *module.buffers()]:
        if t.device.type == "meta" or t.is_mkldnn:  # no storage to share: counted by its elements
            key, nbytes = id(t), t.numel() * t.element_size()  # (oneDNN's blocks may pad a little)
        else:
            storage = t.untyped_storage()
            key, nbytes = storage.data_ptr(), storage.nbytes()
        if key not in seen:
            seen.add(key)
            total += nbytes
    return total

def one_copy_bytes(model: nn.Module) -> int:
    """``held_bytes`` of the same model freshly built on the meta device: its plain weights
    (and buffers) once, as a checkpoint loads them, with nothing allocated."""
    fresh = type(model)(model.config, model.backend, model.dtype, device="meta")
    return held_bytes(fresh)


def kv_cache_bytes(engine) -> int:
    """Bytes of an engine's KV cache (every layer's K and V)."""
    return sum(t.numel() * t.element_size() for pair in engine.kv_caches for t in pair)
