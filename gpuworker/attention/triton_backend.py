"""Paged attention with the Triton kernels: the GPU path.

Each layer's forward is two launches: ``reshape_and_cache`` writes the new
tokens' K/V at ``meta.slot_mapping``, then ``unified_attention`` handles the
whole flattened batch (prefill chunks with context and decodes together),
switching to split-K for small decode-only batches with long contexts.
Nothing here reads device tensors on the host, so a step is sync-free and,
with a fixed ``num_kv_splits``, CUDA-graph capturable.

``batch_invariant=True`` (the engine's default, ``EngineConfig.batch_invariant``):
one tile shape for every step and split-K segments of a fixed number of keys
(``kv_split_tokens``), so a row's attention has the same bits whatever the batch,
its prompt's chunking or the CUDA graph it replays in (docs/kernels.md,
"Batch invariance (GPU)").

CPU: the same kernels run under Triton's interpreter (slowly; for tests) when
``TRITON_INTERPRET=1`` is set in the environment BEFORE this module is
imported, because ``triton.jit`` picks compiled vs interpreted kernels at
import time. Without it, a CPU forward raises a RuntimeError saying so.
"""
from __future__ import annotations

import contextlib
from typing import Iterator

import torch

from inferq.gpuworker.attention.base import AttentionBackend, AttentionMetadata, KVCache
from inferq.kernels.reshape_and_cache import reshape_and_cache_launches
from inferq.kernels.runtime import KernelLaunch, num_compute_units
from inferq.kernels.split_k_decode import KV_SPLIT_TOKENS
from inferq.kernels.unified_attention import compile_variants, unified_attention_launches


class TritonAttentionBackend(AttentionBackend):
    name = "triton"

    def __init__(self, num_kv_splits: int | None = None, batch_invariant: bool = False,
                 kv_split_tokens: int = KV_SPLIT_TOKENS) -> None:
        # None: split-K picked per step from the batch shape (see inferq_kernels/split_k_decode.py);
        # in batch-invariant mode None is enough fixed-size segments for the step's longest sequence.
        if num_kv_splits is not None and (not isinstance(num_kv_splits, int) or num_kv_splits < 1):
            raise ValueError(f"num_kv_splits must be None or an int >= 1, got {num_kv_splits!r}")
        if not isinstance(kv_split_tokens, int) or kv_split_tokens < 64 or kv_split_tokens % 64:
            raise ValueError(f"kv_split_tokens must be a multiple of 64, got {kv_split_tokens!r}")
        self.num_kv_splits = num_kv_splits
        self.batch_invariant = batch_invariant
        self.kv_split_tokens = kv_split_tokens

    @property
    def split_tokens(self) -> int | None:
        """Keys per split-K segment in batch-invariant mode, else None (the kernels' switch)."""
        return self.kv_split_tokens if self.batch_invariant else None

    def forward(
        self,
        q: torch.Tensor,  # [T, Hq, D]
        k: torch.Tensor,  # [T, Hkv, D]
        v: torch.Tensor,  # [T, Hkv, D]
        kv_cache: KVCache,
        meta: AttentionMetadata,
        scale: float,
    ) -> torch.Tensor:
        out, launches = self.launches(q, k, v, kv_cache, meta, scale)
        for launch in launches:
            launch.run()
        return out

    def launches(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        kv_cache: KVCache,
        meta: AttentionMetadata,
        scale: float,
    ) -> tuple[torch.Tensor, list[KernelLaunch]]:
        """The output tensor and the kernel launches of one layer's forward, in order, not run."""
        key_cache, value_cache = kv_cache
        if key_cache.shape[1] != meta.block_size:
            raise ValueError(f"cache block size {key_cache.shape[1]} != metadata block size {meta.block_size}")
        out = torch.empty_like(q)
        cache_write = reshape_and_cache_launches(k, v, key_cache, value_cache, meta.slot_mapping)
        attention = unified_attention_launches(
            q,
            key_cache,
            value_cache,
            out,
            meta.query_start_loc,
            meta.seq_lens,
            meta.block_tables,
            meta.max_query_len,
            meta.max_seq_len,
            scale,
            self.num_kv_splits,
            self.split_tokens,
        )
        return out, cache_write + attention

    def compile_variants(
        self, num_kv_heads: int, max_seq_len: int, max_query_len: int, device: torch.device
    ) -> list[tuple[int, int]]:
        """``(max_query_len, num_kv_splits)`` of one step per kernel variant steps up to these
        limits compile; a forward of each under ``fixed_num_kv_splits`` compiles them all."""
        return compile_variants(num_kv_heads, max_seq_len, max_query_len, num_compute_units(device), self.num_kv_splits,
                                self.split_tokens)

    @contextlib.contextmanager
    def fixed_num_kv_splits(self, num_kv_splits: int) -> Iterator[None]:
        saved, self.num_kv_splits = self.num_kv_splits, num_kv_splits
        try:
            yield
        finally:
            self.num_kv_splits = saved
