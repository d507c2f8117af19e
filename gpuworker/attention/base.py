"""The attention-backend interface the models are written against.

A backend owns two things: the layout of one layer's paged KV cache, and the
attention over it for a flattened varlen batch (any mix of prefill chunks and
decodes). The model runner builds one ``AttentionMetadata`` per step and every
layer shares it.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch


@dataclass
class AttentionMetadata:
    """Describes one step's flattened batch of ``T`` new tokens from ``B`` sequences.

    Sequence ``i`` owns query rows ``query_start_loc[i]:query_start_loc[i+1]``;
    those rows are its tokens at positions ``context_lens[i] .. seq_lens[i]-1``
    (tokens before ``context_lens[i]`` are already in the cache).
    """

    slot_mapping: torch.Tensor  # [T] int64: block_id * block_size + offset; < 0 means skip
    query_start_loc: torch.Tensor  # [B+1] int32, cumulative query lengths
    seq_lens: torch.Tensor  # [B] int32, context + new tokens
    context_lens: torch.Tensor  # [B] int32, tokens already cached before this step
    block_tables: torch.Tensor  # [B, max_blocks] int32, padded with 0
    max_query_len: int
    max_seq_len: int
    block_size: int
    # Host copies so backends can plan without a device sync.
    query_lens_cpu: list[int]
    seq_lens_cpu: list[int]
    # True when the runner knows every slot is >= 0 (saves backends a device check).
    all_slots_valid: bool = False

    @property
    def num_seqs(self) -> int:
        return len(self.seq_lens_cpu)

    @property
    def num_tokens(self) -> int:
        return int(self.slot_mapping.shape[0])

    @property
    def decode_only(self) -> bool:
        return self.max_query_len == 1


KVCache = tuple[torch.Tensor, torch.Tensor]  # (key_cache, value_cache) of one layer


class AttentionBackend(ABC):
    """Cache layout: ``[num_blocks, block_size, num_kv_heads, head_dim]`` for K and V."""

    name: str = "abstract"

    def allocate_kv_cache(
        self,
        num_layers: int,
        num_blocks: int,
        block_size: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device,
    ) -> list[KVCache]:
        shape = (num_blocks, block_size, num_kv_heads, head_dim)
        return [
            (torch.zeros(shape, dtype=dtype, device=device), torch.zeros(shape, dtype=dtype, device=device))
            for _ in range(num_layers)
        ]

    @abstractmethod
    def forward(
        self,
        q: torch.Tensor,  # [T, Hq, D]
        k: torch.Tensor,  # [T, Hkv, D]
        v: torch.Tensor,  # [T, Hkv, D]
        kv_cache: KVCache,
        meta: AttentionMetadata,
        scale: float,
    ) -> torch.Tensor:  # [T, Hq, D]
        """Write k/v of the new tokens into the cache at ``meta.slot_mapping``,
        then attend causally over context + new tokens for every sequence."""


def get_backend(name: str) -> AttentionBackend:
    if name == "torch":
        from inferq.gpuworker.attention.torch_backend import TorchAttentionBackend

        return TorchAttentionBackend()
    if name == "triton":
        from inferq.gpuworker.attention.triton_backend import TritonAttentionBackend

        return TritonAttentionBackend()
    raise ValueError(f"unknown attention backend {name!r}; choose 'torch' or 'triton'")
