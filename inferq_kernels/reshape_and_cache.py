"""Triton kernel: write the step's new K/V rows into the paged cache.

One program per token copies its ``[Hkv, D]`` key and value tiles to slot
``slot_mapping[t]`` (block = slot // block_size, offset = slot % block_size).
A negative slot means "do not cache" (e.g. padding rows) and is skipped.
Inputs may be strided views (k/v split out of a fused qkv projection).

On CPU this only runs under ``TRITON_INTERPRET=1``, which must be set before
this module is imported (``triton.jit`` reads it when the kernel is defined).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from inferq.kernels.checks import check_reshape_and_cache
from inferq.kernels.runtime import KernelLaunch, check_launchable


# The slot mapping is a slice of the model runner's step buffer: its alignment must
# not key a compile (1-3 s each); it is read one scalar per program anyway.
@triton.jit(do_not_specialize_on_alignment=("slot_ptr",))
def _reshape_and_cache_kernel(
    key_ptr, value_ptr, key_cache_ptr, value_cache_ptr, slot_ptr,
    stride_kt, stride_kh, stride_kd,
    stride_vt, stride_vh, stride_vd,
    stride_cb, stride_cs, stride_ch, stride_cd,
    block_size,
    NUM_KV_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HEADS_PAD: tl.constexpr,
    DIM_PAD: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_ptr + token).to(tl.int64)
    if slot < 0:
        return
    block = slot // block_size
    offset = slot % block_size
    heads = tl.arange(0, HEADS_PAD)[:, None]
    dims = tl.arange(0, DIM_PAD)[None, :]
    mask = (heads < NUM_KV_HEADS) & (dims < HEAD_DIM)
    dst = block * stride_cb + offset * stride_cs + heads * stride_ch + dims * stride_cd
    k = tl.load(key_ptr + token * stride_kt + heads * stride_kh + dims * stride_kd, mask=mask)
    tl.store(key_cache_ptr + dst, k.to(key_cache_ptr.dtype.element_ty), mask=mask)
    v = tl.load(value_ptr + token * stride_vt + heads * stride_vh + dims * stride_vd, mask=mask)
    tl.store(value_cache_ptr + dst, v.to(value_cache_ptr.dtype.element_ty), mask=mask)


CACHE_WRITE_LAUNCH_OPTIONS = dict(num_warps=4)


def cache_write_constants(num_kv_heads: int, head_dim: int) -> dict:
    return dict(
        NUM_KV_HEADS=num_kv_heads,
        HEAD_DIM=head_dim,
        HEADS_PAD=triton.next_power_of_2(num_kv_heads),
        DIM_PAD=triton.next_power_of_2(head_dim),
    )


def reshape_and_cache_launches(
    key: torch.Tensor,  # [T, Hkv, D]
    value: torch.Tensor,  # [T, Hkv, D]
    key_cache: torch.Tensor,  # [num_blocks, block_size, Hkv, D]
    value_cache: torch.Tensor,  # [num_blocks, block_size, Hkv, D]
    slot_mapping: torch.Tensor,  # [T] int64; < 0 skips the token
) -> list[KernelLaunch]:
    """The launch of ``reshape_and_cache`` (none for no tokens), not run."""
    check_reshape_and_cache(key, value, key_cache, value_cache, slot_mapping)
    check_launchable(_reshape_and_cache_kernel, key_cache)
    num_tokens = key.shape[0]
    if num_tokens == 0:
        return []
    if key_cache.stride() != value_cache.stride():
        raise ValueError("key_cache and value_cache must have the same strides")
    _, block_size, num_kv_heads, head_dim = key_cache.shape
    return [KernelLaunch(
        _reshape_and_cache_kernel,
        (num_tokens,),
        (
            key, value, key_cache, value_cache, slot_mapping,
            *key.stride(), *value.stride(), *key_cache.stride(),
            block_size,
        ),
        {**cache_write_constants(num_kv_heads, head_dim), **CACHE_WRITE_LAUNCH_OPTIONS},
    )]


def reshape_and_cache(
    key: torch.Tensor,  # [T, Hkv, D]
    value: torch.Tensor,  # [T, Hkv, D]
    key_cache: torch.Tensor,  # [num_blocks, block_size, Hkv, D]
    value_cache: torch.Tensor,  # [num_blocks, block_size, Hkv, D]
    slot_mapping: torch.Tensor,  # [T] int64; < 0 skips the token
) -> None:
    """Write each token's K and V into its cache slot, in place."""
    for launch in reshape_and_cache_launches(key, value, key_cache, value_cache, slot_mapping):
        launch.run()
