"""Compile every Triton kernel variant a step can launch before the engine serves.

Once step-varying arguments no longer key compiles (inferq_kernels/unified_attention.py),
what is left are the constexpr variants: decodes at each split-K count, and prefill
tiles. Each is a 1-3 s compile the first time a step meets it; here one forward of a
one-sequence batch per variant meets them all at start-up (from Triton's cache on
disk after the first start). The batches write nothing (slot -1) and read block 0.
"""
from __future__ import annotations

import logging
import time

import torch

from inferq.gpuworker.attention.base import AttentionMetadata

log = logging.getLogger(__name__)


def write_nothing_batch(query_len: int, block_size: int, device: torch.device):
    """Input ids, positions and metadata of one sequence of ``query_len`` new tokens
    whose keys are not written (slot -1) and whose block table points at block 0."""
    blocks = -(-query_len // block_size)
    meta = AttentionMetadata(
        slot_mapping=torch.full((query_len,), -1, dtype=torch.int64, device=device),
        query_start_loc=torch.tensor([0, query_len], dtype=torch.int32, device=device),
        seq_lens=torch.tensor([query_len], dtype=torch.int32, device=device),
        context_lens=torch.zeros(1, dtype=torch.int32, device=device),
        block_tables=torch.zeros((1, blocks), dtype=torch.int32, device=device),
        max_query_len=query_len,
        max_seq_len=query_len,
        block_size=block_size,
        query_lens_cpu=[query_len],
        seq_lens_cpu=[query_len],
    )
    ids = torch.zeros(query_len, dtype=torch.int64, device=device)
    positions = torch.arange(query_len, dtype=torch.int64, device=device)
    return ids, positions, meta


@torch.inference_mode()
def warm_up_triton_kernels(model, kv_caches, backend, block_size: int, max_model_len: int,
                           max_num_batched_tokens: int, device: torch.device) -> int:
    """One forward per kernel variant of ``backend.compile_variants``; returns how many."""
    cfg = model.config
    variants = backend.compile_variants(cfg.num_kv_heads, max_model_len,
                                        min(max_num_batched_tokens, max_model_len), device)
    start = time.perf_counter()
    for query_len, num_kv_splits in variants:
        ids, positions, meta = write_nothing_batch(query_len, block_size, device)
        with backend.fixed_num_kv_splits(num_kv_splits):
            model(ids, positions, kv_caches, meta)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    log.info("Triton kernels ready: %d variants in %.1f s", len(variants), time.perf_counter() - start)
    return len(variants)
