"""Random paged batches for the kernel tests.

Each sequence is ``(context_len, query_len)``: its whole K/V (context and the
new tokens) sits in the cache in shuffled, non-contiguous blocks, and every
cache slot that no sequence owns (spare blocks, the tail of a partial last
block) holds NaN, so a kernel that reads past a sequence's end or through a
wrong block table entry produces NaN instead of a plausible number.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from inferq.bench.paged_metadata import block_table_tensor, slots

# |kernel - reference| <= atol + rtol * |reference|, the reference computing in
# fp32 from the same rounded inputs. The half-precision bounds are about two
# units in the last place of an O(1) output: both sides round the result to the
# storage dtype, the kernel also rounds the softmax probabilities to it before
# P @ V, and the CPU interpreter truncates (rather than rounds) fp32 -> bf16.
ERROR_BOUNDS = {
    torch.float32: dict(atol=2e-5, rtol=2e-5),
    torch.float16: dict(atol=4e-3, rtol=4e-3),
    torch.bfloat16: dict(atol=3e-2, rtol=3e-2),
}


@dataclass
class PagedBatch:
    q: torch.Tensor  # [T + pad_rows, Hq, D]
    key_cache: torch.Tensor
    value_cache: torch.Tensor
    query_start_loc: torch.Tensor  # [B+1] int32
    seq_lens: torch.Tensor  # [B] int32
    block_tables: torch.Tensor  # [B, max_blocks + 1] int32 (a padding column of zeros)
    max_query_len: int
    max_seq_len: int
    num_rows: int  # T: rows owned by sequences; rows past it are padding

    def attention_args(self, out: torch.Tensor, scale: float, num_kv_splits: int | None = None) -> tuple:
        return (
            self.q, self.key_cache, self.value_cache, out, self.query_start_loc, self.seq_lens,
            self.block_tables, self.max_query_len, self.max_seq_len, scale, num_kv_splits,
        )

    def poisoned_out(self) -> torch.Tensor:
        return torch.full_like(self.q, float("nan"))


def make_paged_batch(
    chunks: list[tuple[int, int]],
    *,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    block_size: int,
    dtype: torch.dtype,
    device: torch.device | str,
    seed: int,
    pad_rows: int = 0,
    spare_blocks: int = 3,
    magnitude: float = 1.0,
) -> PagedBatch:
    gen = torch.Generator().manual_seed(seed)
    seq_lens = [ctx + q for ctx, q in chunks]
    blocks_per_seq = [-(-n // block_size) for n in seq_lens]
    num_blocks = sum(blocks_per_seq) + spare_blocks
    order = torch.randperm(num_blocks, generator=gen).tolist()

    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    key_cache = torch.full(shape, float("nan"))
    value_cache = torch.full(shape, float("nan"))
    flat_keys = key_cache.view(-1, num_kv_heads, head_dim)
    flat_values = value_cache.view(-1, num_kv_heads, head_dim)
    tables, next_block = [], 0
    for n_tokens, n_blocks in zip(seq_lens, blocks_per_seq):
        table = order[next_block : next_block + n_blocks]
        next_block += n_blocks
        tables.append(table)
        where = slots(table, torch.arange(n_tokens), block_size)
        flat_keys[where] = torch.randn(n_tokens, num_kv_heads, head_dim, generator=gen) * magnitude
        flat_values[where] = torch.randn(n_tokens, num_kv_heads, head_dim, generator=gen)
    block_tables = block_table_tensor(tables, max(blocks_per_seq) + 1)  # + a padding column of zeros

    query_lens = [q for _, q in chunks]
    num_rows = sum(query_lens)
    q = torch.randn(num_rows + pad_rows, num_heads, head_dim, generator=gen) * magnitude
    starts = [0]
    for n in query_lens:
        starts.append(starts[-1] + n)
    return PagedBatch(
        q=q.to(dtype).to(device),
        key_cache=key_cache.to(dtype).to(device),
        value_cache=value_cache.to(dtype).to(device),
        query_start_loc=torch.tensor(starts, dtype=torch.int32, device=device),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=device),
        block_tables=block_tables.to(device),
        max_query_len=max(query_lens),
        max_seq_len=max(seq_lens),
        num_rows=num_rows,
    )
