"""When split-K engages on its own, and the shape of its answer."""
from __future__ import annotations

from inferq.kernels.split_k_decode import MAX_SPLITS, choose_num_kv_splits

H200_SMS = 132


def test_prefill_or_mixed_steps_never_split():
    assert choose_num_kv_splits(1, 3, max_query_len=2, max_seq_len=8192, num_compute_units=H200_SMS) == 1
    assert choose_num_kv_splits(1, 3, max_query_len=512, max_seq_len=8192, num_compute_units=H200_SMS) == 1


def test_a_large_decode_batch_already_fills_the_gpu():
    # SmolLM2 shapes: 3 KV heads; 64 sequences = 192 programs > 132 SMs.
    assert choose_num_kv_splits(64, 3, 1, 1024, H200_SMS) == 1
    assert choose_num_kv_splits(256, 3, 1, 1024, H200_SMS) == 1


def test_short_contexts_do_not_split():
    assert choose_num_kv_splits(1, 3, 1, 200, H200_SMS) == 1


def test_a_small_decode_batch_with_long_context_splits_in_powers_of_two():
    for num_seqs, max_seq_len in [(1, 1024), (1, 100_000), (4, 4096), (16, 2048)]:
        splits = choose_num_kv_splits(num_seqs, 3, 1, max_seq_len, H200_SMS)
        assert 2 <= splits <= MAX_SPLITS
        assert splits & (splits - 1) == 0
        assert splits * 128 <= max_seq_len  # every segment keeps at least 128 keys
    # batch 1 at 1k context: 1024 // 128 = 8 segments per KV head
    assert choose_num_kv_splits(1, 3, 1, 1024, H200_SMS) == 8
    # more sequences -> fewer splits
    assert choose_num_kv_splits(16, 3, 1, 8192, H200_SMS) < choose_num_kv_splits(1, 3, 1, 8192, H200_SMS)
