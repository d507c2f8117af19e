"""Batch-invariant mode of the Triton attention (kernels interpreted on CPU, compiled on a GPU):
a sequence's output rows have the same bits whatever the step they run in.

One target sequence (its q, K and V fixed) runs as a whole 100-token prompt alone, in chunks
cut at odd places beside other sequences' chunks and decodes, and as single decode rows in
batches of decodes, with the grid's segment count chosen by the step or fixed larger (as a
CUDA graph of another size fixes it). Segments are 64 keys here so the prompt crosses a
segment border. Every (position, head) row must equal the whole-prompt run bit for bit
(``torch.equal``) and the fp32 reference within the usual bound.
"""
from __future__ import annotations

import pytest
import torch

from inferq.kernels import reference
from inferq.kernels.unified_attention import unified_attention
from tests.kernels.conftest import DEVICE
from tests.kernels.paged_batch import ERROR_BOUNDS

HQ, HKV, D, BLOCK = 2, 1, 16, 16  # kept small: the interpreter runs every program in Python
SPLIT = 64  # keys per segment (the engine's default is 512)
TARGET_LEN = 100
SCALE = D**-0.5


def sequence(length: int, seed: int, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {name: torch.randn(length, heads, D, generator=g).to(dtype)
            for name, heads in (("q", HQ), ("k", HKV), ("v", HKV))}


def run_step(seqs: list[tuple[dict, int, int]], dtype, split_tokens: int | None, num_kv_splits: int | None = None,
             seed: int = 0) -> list[torch.Tensor]:
    """One unified_attention call over ``(sequence, context_len, query_len)`` items; each
    sequence's K/V up to context + query sit in shuffled cache blocks. Returns each item's
    output rows ``[query_len, HQ, D]``."""
    lens = [ctx + n for _, ctx, n in seqs]
    counts = [-(-n // BLOCK) for n in lens]
    order = torch.randperm(sum(counts) + 2, generator=torch.Generator().manual_seed(seed)).tolist()
    key_cache = torch.full((len(order), BLOCK, HKV, D), float("nan"), dtype=dtype)
    value_cache = key_cache.clone()
    tables, q_rows, first = [], [], 0
    for (s, ctx, n), length, count in zip(seqs, lens, counts):
        table = order[first:first + count]
        first += count
        tables.append(table + [0] * (max(counts) - count))
        for pos in range(length):
            key_cache[table[pos // BLOCK], pos % BLOCK] = s["k"][pos]
            value_cache[table[pos // BLOCK], pos % BLOCK] = s["v"][pos]
        q_rows.append(s["q"][ctx:length])
    q = torch.cat(q_rows)
    qsl = torch.tensor([0] + [sum(n for _, _, n in seqs[: i + 1]) for i in range(len(seqs))], dtype=torch.int32)
    args = dict(q=q, key_cache=key_cache, value_cache=value_cache, query_start_loc=qsl,
                seq_lens=torch.tensor(lens, dtype=torch.int32), block_tables=torch.tensor(tables, dtype=torch.int32),
                max_query_len=max(n for _, _, n in seqs), max_seq_len=max(lens), softmax_scale=SCALE)
    on = {k: v.to(DEVICE) if isinstance(v, torch.Tensor) else v for k, v in args.items()}
    out = unified_attention(**on, out=torch.full_like(on["q"], float("nan")), num_kv_splits=num_kv_splits,
                            kv_split_tokens=split_tokens).cpu()
    ref = reference.unified_attention(**args, out=torch.empty_like(q))
    torch.testing.assert_close(out.float(), ref.float(), **ERROR_BOUNDS[dtype])
    return list(out.split([n for _, _, n in seqs]))


@pytest.fixture(params=[torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def dtype(request):
    return request.param


def test_a_rows_bits_do_not_depend_on_batch_chunking_or_segment_count(dtype):
    target = sequence(TARGET_LEN, 1, dtype)
    others = [sequence(n, 2 + i, dtype) for i, n in enumerate((70, 30, 90))]
    whole = run_step([(target, 0, TARGET_LEN)], dtype, SPLIT)[0]

    # Chunks cut at odd places (one ends mid-segment, one crosses a segment border), each
    # beside another sequence's chunk and decodes; the grid's segment count follows the step.
    got = []
    for lo, hi, mates in ((0, 37, [(others[0], 40, 30), (others[1], 29, 1)]),
                          (37, 70, [(others[2], 89, 1)]),
                          (70, TARGET_LEN, [(others[1], 0, 30), (others[0], 69, 1), (others[2], 80, 10)])):
        got.append(run_step(mates[:1] + [(target, lo, hi - lo)] + mates[1:], dtype, SPLIT, seed=lo)[1])
    assert torch.equal(torch.cat(got), whole)

    # Decode rows: alone, in a batch of decodes, and with a fixed larger segment count (a
    # CUDA graph's, from the longest context it may see), at and around segment borders.
    for pos in (0, 63, 64, TARGET_LEN - 1):
        alone = run_step([(target, pos, 1)], dtype, SPLIT, seed=pos)[0]
        batched = run_step([(others[2], 80, 1), (target, pos, 1), (others[0], 3, 1)], dtype, SPLIT, seed=pos)[1]
        graph = run_step([(target, pos, 1), (others[1], 20, 1)], dtype, SPLIT, num_kv_splits=4, seed=pos)[0]
        for row in (alone, batched, graph):
            assert torch.equal(row, whole[pos : pos + 1]), f"decode row at position {pos}"


def test_the_default_mode_changes_a_rows_bits_with_the_split_count():
    """What batch-invariant mode removes: split-K chosen per step cuts a row's keys elsewhere."""
    dtype = torch.float32
    target = sequence(TARGET_LEN, 1, dtype)
    one = run_step([(target, TARGET_LEN - 1, 1)], dtype, None, num_kv_splits=1)[0]
    three = run_step([(target, TARGET_LEN - 1, 1)], dtype, None, num_kv_splits=3)[0]
    assert not torch.equal(one, three)


def test_too_few_segments_for_the_longest_sequence_is_a_clear_error():
    target = sequence(TARGET_LEN, 1, torch.float32)
    with pytest.raises(ValueError, match="needs at least 2"):
        run_step([(target, TARGET_LEN - 1, 1)], torch.float32, SPLIT, num_kv_splits=1)


def test_a_step_cut_into_pieces_of_rows_gives_the_same_bits(monkeypatch):
    """A step whose split-K scratch would pass MAX_PARTIAL_BYTES runs in pieces of rows, cut
    inside sequences' chunks; every row keeps its bits."""
    from inferq.kernels import unified_attention as module

    dtype = torch.float32
    target = sequence(TARGET_LEN, 1, dtype)
    others = [sequence(n, 2 + i, dtype) for i, n in enumerate((70, 30, 90))]
    step = [(others[0], 40, 30), (target, 37, 33), (others[1], 29, 1), (others[2], 80, 10)]
    whole = run_step(step, dtype, SPLIT)
    monkeypatch.setattr(module, "MAX_PARTIAL_BYTES", 7 * HQ * 2 * 16 * 4)  # 7 rows of 2 segments
    pieces = run_step(step, dtype, SPLIT)
    assert all(torch.equal(a, b) for a, b in zip(whole, pieces))
