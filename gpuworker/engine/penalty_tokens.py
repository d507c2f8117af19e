"""A request's token history for the sampler's penalties, kept across steps.

Penalties need, per row, the prompt's token ids (repetition) and the output ids
so far (repetition, frequency, presence). Turning those Python lists into
tensors every step cost ~38 ms of host time at 256 requests x 2,000-token
prompts. Here the prompt becomes a tensor of its distinct ids once, on the
device, and the output ids live in a host array that grows by the one new token
a step, so a step copies only what is new.
"""
from __future__ import annotations

from typing import Optional

import numpy as np
import torch

from inferq.gpuworker.engine.token_mirror import TokenMirror


class PenaltyTokens:
    def __init__(self, prompt_token_ids: list[int], vocab_size: int, device, with_prompt: bool = True):
        self.prompt: Optional[torch.Tensor] = None  # distinct prompt ids < vocab_size, on the device
        if with_prompt:
            ids = np.unique(np.asarray(prompt_token_ids, dtype=np.int64))
            ids = ids[(ids >= 0) & (ids < vocab_size)]  # a tokenizer larger than the head
            self.prompt = _to_device(torch.from_numpy(ids), torch.device(device))
        self._out = TokenMirror()

    def outputs(self, output_token_ids: list[int]) -> np.ndarray:
        """The output ids as a host array (a view: valid until the next call)."""
        return self._out.sync(output_token_ids)


def _to_device(host: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A non-blocking copy from pinned memory: a plain ``.to(cuda)`` waits for the GPU's queue."""
    if device.type != "cuda":
        return host.to(device)
    return host.pin_memory().to(device, non_blocking=True)
