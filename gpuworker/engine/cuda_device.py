"""The engine's CUDA device as the current device of every thread that runs it.

Triton launches on the calling thread's current CUDA device (torch ops follow
their tensors, Triton kernels do not), and CUDA's current device is per thread:
an engine on ``cuda:1`` built or stepped from a thread still on ``cuda:0``
would launch its kernels on the wrong GPU (illegal memory accesses).
"""
from __future__ import annotations

import torch


def bind_cuda_device(device: torch.device) -> torch.device:
    """Make ``device`` (``cuda`` or ``cuda:N``) this thread's current device; returns it with
    its index, so later checks compare indices."""
    if device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    torch.cuda.set_device(device)
    return device


def keep_cuda_device(device: torch.device) -> None:
    """Per step: the thread stepping the engine need not be the one that built it."""
    if torch.cuda.current_device() != device.index:
        torch.cuda.set_device(device)
