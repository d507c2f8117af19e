"""Serving never compiles a Triton kernel inside the step loop.

Triton compiles one kernel per distinct key: argument types, ints equal to 1 or
divisible by 16, pointers 16-byte aligned, constexprs, launch options. The keys
here come from Triton's own launch binder (inferq.kernels.compile_key) over the
arguments the triton backend builds, not launched, for the model runner's real
metadata (ModelRunner.build_metadata: one step buffer sliced into views) and a
real model's q/k/v, for every batch size 1-300 and block-table width 1-600,
decodes and prefill chunks. Only the constexpr variants may key compiles, and the
start-up warm-up (gpuworker/engine/kernel_warmup.py) must meet every one of them.

The model: 1 layer, 4 query / 2 KV heads of 16, bf16, 600 blocks of 16 per sequence.
Its variants: unified attention 8 (decodes at split-K 1, 2, 4, ..., 64 and 64-row
prefill tiles), split-K merge 6 (2 ... 64), cache write 1: 15 keys in all.
"""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from inferq.gpuworker.attention.triton_backend import TritonAttentionBackend
from inferq.gpuworker.engine.kernel_warmup import warm_up_triton_kernels
from inferq.gpuworker.engine.model_runner import ModelRunner
from inferq.gpuworker.engine.scheduler import ScheduledRequest, SchedulerOutput
from inferq.gpuworker.models.config import ModelConfig
from inferq.gpuworker.models.llama import LlamaForCausalLM
from inferq.kernels.compile_key import compile_key
from tests.kernels.conftest import DEVICE

BLOCK_SIZE = 16
MAX_BATCH, MAX_WIDTH = 300, 600
MAX_MODEL_LEN = MAX_WIDTH * BLOCK_SIZE
EXPECTED_KEYS = {"_unified_attention_kernel": 8, "_merge_kv_splits_kernel": 6, "_reshape_and_cache_kernel": 1}


class KeyRecordingBackend(TritonAttentionBackend):
    """Builds each layer's launches as the triton backend does, records their compile
    keys by constexpr variant, and launches nothing."""

    def __init__(self) -> None:
        super().__init__()
        self.keys: dict[tuple, set] = {}

    def forward(self, q, k, v, kv_cache, meta, scale):
        out, launches = self.launches(q, k, v, kv_cache, meta, scale)
        for launch in launches:
            variant = (launch.kernel.fn.__name__, tuple(sorted(launch.kwargs.items())))
            self.keys.setdefault(variant, set()).add(compile_key(launch))
        return out

    def all_keys(self) -> set:
        return set().union(*self.keys.values())


def tiny_model(backend) -> LlamaForCausalLM:
    cfg = ModelConfig(
        architecture="LlamaForCausalLM", model_type="llama", vocab_size=256, hidden_size=64, num_layers=1,
        num_heads=4, num_kv_heads=2, head_dim=16, intermediate_size=128, rms_norm_eps=1e-6, rope_theta=10000.0,
        rope_scaling=None, max_position_embeddings=MAX_MODEL_LEN, tie_word_embeddings=False,
        attention_bias=False, o_proj_bias=False, mlp_bias=False, qk_norm=False, bos_token_id=1,
        eos_token_ids=[2], torch_dtype=None,
    )
    model = LlamaForCausalLM(cfg, backend, dtype=torch.bfloat16, device=DEVICE)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.05)
    return model


class Tokens:
    """A request's token ids without the list (sequences up to 9600 tokens, 300 a step)."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i):
        return [0] * len(range(self.n)[i]) if isinstance(i, slice) else 0


def schedule(step: int, seq_lens: list[int], query_lens: list[int]):
    """A step of these sequences (total length, new tokens), as the scheduler hands it to the runner."""
    scheduled, blocks = [], {}
    for i, (seq_len, query_len) in enumerate(zip(seq_lens, query_lens)):
        rid = f"{step}-{i}"
        request = SimpleNamespace(request_id=rid, all_token_ids=Tokens(seq_len))
        scheduled.append(ScheduledRequest(request, query_len, seq_len - query_len))
        blocks[rid] = [(7 * i + j) % 64 for j in range(-(-seq_len // BLOCK_SIZE))]
    return SchedulerOutput(scheduled=scheduled), SimpleNamespace(req_block_ids=blocks)


def step_shapes():
    """(seq_lens, query_lens) of decode-only, mixed and prefill steps covering every batch
    size 1-300 and every block-table width 1-600."""
    shapes = []

    def decodes(batch: int, width: int, chunk: int = 0):
        longest = width * BLOCK_SIZE - (batch % BLOCK_SIZE)
        seq_lens = [longest] + [1 + (37 * i) % longest for i in range(1, batch)]
        query_lens = [1] * batch
        if chunk:  # the last sequence is a prompt chunk
            seq_lens[-1] = max(seq_lens[-1], chunk)
            query_lens[-1] = chunk
        shapes.append((seq_lens, query_lens))

    for batch in range(1, MAX_BATCH + 1):
        decodes(batch, 1 + (batch * 37) % MAX_WIDTH)
        decodes(batch, 1 + batch % 20)  # short contexts: widths 1-20, split-K off or low
    for width in range(1, MAX_WIDTH + 1):
        decodes(1 + (width * 7) % MAX_BATCH, width)
        decodes(1 + width % 4, width)  # few long sequences: split-K up to 64
    for batch in range(1, MAX_BATCH + 1, 7):
        decodes(batch, 1 + (batch * 13) % MAX_WIDTH, chunk=2 + batch % 60)  # decodes beside a prompt chunk
    return shapes


@pytest.fixture(scope="module")
def engine_parts():
    backend = KeyRecordingBackend()
    model = tiny_model(backend)
    kv_caches = backend.allocate_kv_cache(1, 64, BLOCK_SIZE, 2, 16, torch.bfloat16, DEVICE)
    return backend, model, kv_caches


@pytest.fixture(scope="module")
def step_keys(engine_parts):
    backend, model, kv_caches = engine_parts
    backend.keys.clear()
    runner = ModelRunner(model, kv_caches, BLOCK_SIZE, DEVICE, max_num_seqs=MAX_BATCH, max_model_len=MAX_MODEL_LEN)
    batches, widths = set(), set()
    with torch.inference_mode():
        for step, (seq_lens, query_lens) in enumerate(step_shapes()):
            ids, positions, meta, _, _, _ = runner.build_metadata(*schedule(step, seq_lens, query_lens))
            batches.add(meta.num_seqs)
            widths.add(meta.block_tables.shape[1])
            model(ids, positions, kv_caches, meta)
    assert batches == set(range(1, MAX_BATCH + 1)) and widths == set(range(1, MAX_WIDTH + 1))
    return dict(backend.keys)


def test_only_constexpr_variants_key_compiles_over_batch_sizes_and_table_widths(step_keys):
    recompiles = {variant: len(keys) for variant, keys in step_keys.items() if len(keys) > 1}
    assert not recompiles, f"step-varying arguments key extra compiles: {recompiles}"
    per_kernel = {}
    for kernel, _ in step_keys:
        per_kernel[kernel] = per_kernel.get(kernel, 0) + 1
    assert per_kernel == EXPECTED_KEYS
    assert sum(len(keys) for keys in step_keys.values()) == 15


def test_start_up_warm_up_compiles_every_key_the_steps_meet(engine_parts, step_keys):
    backend, model, kv_caches = engine_parts
    backend.keys.clear()
    variants = warm_up_triton_kernels(model, kv_caches, backend, BLOCK_SIZE, MAX_MODEL_LEN, 2048, DEVICE)
    warmed = backend.all_keys()
    met = set().union(*step_keys.values())
    assert variants == 8 and len(warmed) == 15
    assert met <= warmed, f"{len(met - warmed)} keys met while serving were not warmed"
