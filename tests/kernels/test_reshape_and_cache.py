"""Triton reshape_and_cache against the torch reference: bit-exact copies."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from inferq.kernels import reference
from inferq.kernels.reshape_and_cache import reshape_and_cache

REPO = Path(__file__).resolve().parents[2]


def random_cache(num_blocks, block_size, num_kv_heads, head_dim, dtype, device, gen):
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    return (
        torch.randn(shape, generator=gen).to(dtype).to(device),
        torch.randn(shape, generator=gen).to(dtype).to(device),
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("block_size, num_kv_heads, head_dim", [(16, 2, 64), (32, 3, 128), (16, 1, 16)])
def test_matches_reference_and_skips_negative_slots(device, dtype, block_size, num_kv_heads, head_dim):
    gen = torch.Generator().manual_seed(block_size * head_dim + num_kv_heads)
    num_blocks, num_tokens = 6, 11
    key_cache, value_cache = random_cache(num_blocks, block_size, num_kv_heads, head_dim, dtype, device, gen)
    slots = torch.randperm(num_blocks * block_size, generator=gen)[:num_tokens]
    slots[[2, 7]] = -1  # padding rows: must not be written anywhere
    slots = slots.to(device)
    key = torch.randn(num_tokens, num_kv_heads, head_dim, generator=gen).to(dtype).to(device)
    value = torch.randn(num_tokens, num_kv_heads, head_dim, generator=gen).to(dtype).to(device)

    expected_k, expected_v = key_cache.clone(), value_cache.clone()
    before_k = key_cache.clone()
    reference.reshape_and_cache(key, value, expected_k, expected_v, slots)
    reshape_and_cache(key, value, key_cache, value_cache, slots)

    assert torch.equal(key_cache, expected_k)
    assert torch.equal(value_cache, expected_v)
    written = torch.zeros(num_blocks * block_size, dtype=torch.bool)
    written[slots[slots >= 0].cpu()] = True
    flat_before = before_k.view(-1, num_kv_heads, head_dim)
    flat_after = key_cache.view(-1, num_kv_heads, head_dim)
    assert torch.equal(flat_after[~written.to(device)], flat_before[~written.to(device)]), "a slot not in slot_mapping changed"


def test_strided_key_value_views_from_a_fused_projection(device):
    # k and v are column slices of a qkv projection: row stride != Hkv * D.
    gen = torch.Generator().manual_seed(1)
    num_tokens, num_kv_heads, head_dim = 5, 2, 32
    qkv = torch.randn(num_tokens, (4 + 2 + 2) * head_dim, generator=gen).to(device)
    key = qkv[:, 4 * head_dim : 6 * head_dim].view(num_tokens, num_kv_heads, head_dim)
    value = qkv[:, 6 * head_dim :].view(num_tokens, num_kv_heads, head_dim)
    assert not key.is_contiguous()
    key_cache, value_cache = random_cache(3, 16, num_kv_heads, head_dim, torch.float32, device, gen)
    expected_k, expected_v = key_cache.clone(), value_cache.clone()
    slots = torch.tensor([0, 15, 16, 40, -1], device=device)
    reference.reshape_and_cache(key, value, expected_k, expected_v, slots)
    reshape_and_cache(key, value, key_cache, value_cache, slots)
    assert torch.equal(key_cache, expected_k)
    assert torch.equal(value_cache, expected_v)


def test_casts_to_the_cache_dtype(device):
    gen = torch.Generator().manual_seed(2)
    key = torch.randn(3, 1, 16, generator=gen).to(device)
    key_cache, value_cache = random_cache(2, 16, 1, 16, torch.bfloat16, device, gen)
    slots = torch.tensor([4, 20, 31], device=device)
    reshape_and_cache(key, key, key_cache, value_cache, slots)
    if device.type == "cuda":
        exact = dict(atol=0.0, rtol=0.0)  # round-to-nearest-even, as torch does
    else:
        exact = dict(atol=0.0, rtol=2**-7)  # the interpreter truncates fp32 -> bf16: within one bf16 ulp
    torch.testing.assert_close(key_cache[0, 4].float(), key[0].to(torch.bfloat16).float(), **exact)
    torch.testing.assert_close(value_cache[1, 15].float(), key[2].to(torch.bfloat16).float(), **exact)


def test_bad_shapes_get_a_clear_error(device):
    cache = torch.zeros(2, 16, 2, 64, device=device)
    key = torch.zeros(3, 2, 32, device=device)
    with pytest.raises(ValueError, match="key must be"):
        reshape_and_cache(key, key, cache, cache.clone(), torch.zeros(3, dtype=torch.int64, device=device))
    key = torch.zeros(3, 2, 64, device=device)
    with pytest.raises(ValueError, match="slot_mapping must be"):
        reshape_and_cache(key, key, cache, cache.clone(), torch.zeros(4, dtype=torch.int64, device=device))


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only error; this machine has CUDA")
def test_cpu_without_interpreter_says_how_to_fix_it():
    code = (
        "import torch\n"
        "from inferq.kernels.reshape_and_cache import reshape_and_cache\n"
        "c = torch.zeros(1, 16, 1, 16)\n"
        "k = torch.zeros(1, 1, 16)\n"
        "reshape_and_cache(k, k, c, c.clone(), torch.zeros(1, dtype=torch.int64))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(REPO)
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode != 0
    assert "TRITON_INTERPRET=1" in result.stderr
