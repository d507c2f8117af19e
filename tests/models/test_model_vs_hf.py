"""Our Llama-family model, run through the paged cache in chunks, against HF
transformers on the same weights (fp32, teacher forcing).

Four sequences run in ONE flattened batch per step, each with its own chunk
schedule, so steps mix fresh prefills, chunks that start mid-block with context
in the cache, and decodes. Every new token's logits are compared with HF's
full-sequence forward."""
from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from inferq.gpuworker.models.loader import load_model
from tests.models.paged import PagedDriver
from tests.tiny_models import TINY_ARCHS, save_tiny_model

# bound on |ours - HF| over all logits (fp32; observed ~2e-5 on logits of magnitude ~60)
ATOL = 1e-4

# per sequence: chunk sizes in step order (block size 16). The last three are decodes.
SCHEDULES = [
    [7, 20, 10, 1, 1, 1],  # boundaries at 7, 27: mid-block
    [30, 25, 17, 1, 1, 1],  # 30, 55, 72: mid-block; third chunk crosses two blocks
    [2, 1, 1, 1],  # becomes a decode while the others still prefill
    [16, 14, 1, 1, 1],  # first chunk is exactly one block
]


def sequences(tokenizer) -> list[list[int]]:
    gen = torch.Generator().manual_seed(1)
    texts = [
        "The quick brown fox jumps over the lazy dog while the cat watches from the",
        "def add(a, b):\n    return a + b\n\nprint(add(2, 3))",
        "Hi",
        "Paged attention stores keys and values in fixed-size blocks.",
    ]
    out = []
    for text, schedule in zip(texts, SCHEDULES):
        need = sum(schedule)
        ids = tokenizer(text).input_ids[:need]
        ids += torch.randint(3, tokenizer.vocab_size, (need - len(ids),), generator=gen).tolist()
        out.append(ids)
    return out


def run_chunked(model, seqs, block_size=16) -> list[torch.Tensor]:
    driver = PagedDriver(model, model.backend, block_size=block_size)
    done = [0] * len(seqs)
    outs: list[list[torch.Tensor]] = [[] for _ in seqs]
    for step in range(max(len(s) for s in SCHEDULES)):
        work = []
        for i, schedule in enumerate(SCHEDULES):
            if step < len(schedule):
                work.append((i, seqs[i][done[i] : done[i] + schedule[step]]))
                done[i] += schedule[step]
        for (i, _), logits in zip(work, driver.step(work)):
            outs[i].append(logits)
    return [torch.cat(o) for o in outs]


@pytest.fixture(scope="module", params=TINY_ARCHS)
def tiny(request, tmp_path_factory):
    folder = save_tiny_model(request.param, tmp_path_factory.mktemp(request.param))
    ours = load_model(str(folder))
    hf = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    return request.param, ours, hf


def test_chunked_paged_logits_match_hf(tiny):
    arch, ours, hf = tiny
    seqs = sequences(ours.tokenizer)
    got = run_chunked(ours.model, seqs)
    for ids, logits in zip(seqs, got):
        with torch.no_grad():
            ref = hf(torch.tensor([ids])).logits[0].float()
        assert logits.shape == ref.shape
        err = (logits - ref).abs().max().item()
        assert err < ATOL, f"{arch}: len {len(ids)} max abs diff {err}"


def test_compute_logits_is_float32_and_hidden_has_model_width(tiny):
    _, ours, _ = tiny
    driver = PagedDriver(ours.model, ours.model.backend)
    (logits,) = driver.step([(0, [1, 2, 3])])
    assert logits.dtype == torch.float32
    assert logits.shape == (3, ours.config.vocab_size)


def test_config_switches_reach_the_model(tiny):
    arch, ours, _ = tiny
    cfg = ours.config
    assert cfg.architecture == {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM",
                                "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}[arch]
    layer = ours.model.layers[0]
    assert (layer.qkv_bias is not None) == (arch == "qwen2")
    assert (layer.q_norm is not None) == (arch == "qwen3")
    assert (ours.model.lm_head is ours.model.embed_tokens) == cfg.tie_word_embeddings
    if arch == "llama":
        assert cfg.rope_scaling["rope_type"] == "llama3"
    if arch == "qwen3":
        assert cfg.head_dim == 32 != cfg.hidden_size // cfg.num_heads


def test_bfloat16_tracks_float32(tmp_path):
    folder = save_tiny_model("qwen3", tmp_path / "m")
    seqs = sequences(load_model(str(folder)).tokenizer)
    f32 = run_chunked(load_model(str(folder)).model, seqs)
    bf16 = run_chunked(load_model(str(folder), dtype=torch.bfloat16).model, seqs)
    agree = sum(int((a.argmax(-1) == b.argmax(-1)).sum()) for a, b in zip(f32, bf16))
    total = sum(a.shape[0] for a in f32)
    assert agree >= 0.9 * total, f"bf16 greedy agrees on only {agree}/{total} positions"


def test_sharded_checkpoint_loads_the_same_weights(tmp_path):
    folder = save_tiny_model("llama", tmp_path / "one", seed=3)
    hf = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    sharded = tmp_path / "sharded"
    hf.save_pretrained(sharded, max_shard_size="4MB")
    for f in folder.glob("tokenizer*"):
        (sharded / f.name).write_bytes(f.read_bytes())
    assert (sharded / "model.safetensors.index.json").is_file()
    assert len(list(sharded.glob("*.safetensors"))) > 1
    a = load_model(str(folder)).model
    b = load_model(str(sharded)).model
    for (na, pa), (nb, pb) in zip(a.named_parameters(), b.named_parameters()):
        assert na == nb and torch.equal(pa, pb), na
