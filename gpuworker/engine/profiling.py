"""Memory profiling on CUDA: how much activation memory the largest step needs."""
from __future__ import annotations

import torch

from inferq.gpuworker.attention.base import AttentionMetadata


@torch.inference_mode()
def peak_activation_bytes(engine) -> None:
    """One dummy forward of max_num_batched_tokens tokens in a single sequence,
    against a one-block-per-sequence scratch cache, so the allocator's peak
    reflects the biggest step the scheduler can produce."""
    cfg, mc, dev = engine.config, engine.model_config, engine.device
    t = cfg.max_num_batched_tokens
    bs = cfg.block_size
    n_blocks = -(-t // bs)
    dtype = next(engine.model.parameters()).dtype
    scratch = engine.backend.allocate_kv_cache(mc.num_layers, n_blocks, bs, mc.num_kv_heads, mc.head_dim, dtype, dev)
    meta = AttentionMetadata(
        slot_mapping=torch.arange(t, device=dev, dtype=torch.int64),
        query_start_loc=torch.tensor([0, t], dtype=torch.int32, device=dev),
        seq_lens=torch.tensor([t], dtype=torch.int32, device=dev),
        context_lens=torch.tensor([0], dtype=torch.int32, device=dev),
        block_tables=torch.arange(n_blocks, dtype=torch.int32, device=dev)[None],
        max_query_len=t,
        max_seq_len=t,
        block_size=bs,
        query_lens_cpu=[t],
        seq_lens_cpu=[t],
    )
    ids = torch.zeros(t, dtype=torch.int64, device=dev)
    hidden = engine.model(ids, torch.arange(t, device=dev), scratch, meta)
    engine.model.compute_logits(hidden[-min(t, cfg.max_num_seqs):])
    del scratch, hidden
    torch.cuda.synchronize(dev)
