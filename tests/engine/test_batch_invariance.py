"""Batch invariance: a request's greedy tokens do not depend on the requests that share its
steps, on how its prompt was chunked (max_num_batched_tokens), on prefix-cache hits, nor on
the thread count, in float32 and in bfloat16 on the CPU kernels.

Each case runs the same prompts through a fresh engine in one configuration and must give
the token ids of the reference run, token for token: every prompt alone, one at a time, with
a budget that takes a whole prompt in one step (max_num_batched_tokens=2048) on one thread.
The configurations: all prompts together (the batch mixes prompt chunks and decodes of
different lengths), with a budget of 64 and of 16 tokens (prompts in chunks, cut at
different places), on 2 threads, and all together a second time on the same engine (the
prompts' blocks then come from the prefix cache: a prompt step starts after a context).

A random-weight model of a real shape (head size 64, 3 query heads per kv head, as SmolLM2)
makes the fast cases; random weights give logits with few near-ties, where a difference in
the last bits rarely flips a token, so the bundled SmolLM2 runs them too (slow). The
model-level test compares hidden states bit for bit, which no lucky margin can hide.
(docs/kernels.md, "Batch invariance", says which kernels make it so.)
"""
from __future__ import annotations

import random

import pytest
import torch

from inferq.gpuworker import LLM
from inferq.schemas import SamplingParams

DTYPES = ("float32", "bfloat16")
CASES = ("together", "chunk64", "chunk16", "threads2", "prefix_hit", "preempted", "beside_sampled")


def _bf16_ok() -> bool:
    from inferq.gpuworker.config import cpu_bf16_support

    return cpu_bf16_support() is not None


def _dtype_params():
    return [pytest.param(d, marks=pytest.mark.skipif(d == "bfloat16" and not _bf16_ok(),
                                                     reason="bf16 needs AVX512-BF16 or AMX here"))
            for d in DTYPES]


def _prompts(n: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    lengths = [1, 2, 5, 16, 17, 31, 47, 70, 113, 190][:n]
    return [[rng.randint(1000, 40000) for _ in range(k)] for k in lengths]


def _generate(model: str | None, dtype: str, prompts, params, *, chunk: int, threads: int,
              alone: bool = False, repeat: int = 1, kv_blocks: int = 512, sampled: int = 0) -> list[list[int]]:
    """Greedy token ids of each prompt. ``repeat``: run them again (the second time from the prefix
    cache); ``kv_blocks``: the cache size (few: requests are preempted and recomputed);
    ``sampled``: that many sampled requests (temperature 1, seeded) share the steps."""
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        llm = LLM(model=model, dtype=dtype, max_num_batched_tokens=chunk, num_kv_blocks=kv_blocks, max_num_seqs=32)
        for _ in range(repeat):
            if alone:
                outs = [llm.generate([p], params)[0] for p in prompts]
            else:
                extra = [p[::-1] for p in prompts[-sampled:]] if sampled else []
                hot = [params.model_copy(update={"temperature": 1.0, "seed": i}) for i in range(len(extra))]
                outs = llm.generate(prompts + extra, [params] * len(prompts) + hot)[: len(prompts)]
        stats = llm.engine.stats()
        if repeat > 1:
            assert stats.prefix_cache_hits > 0
        if kv_blocks < 512:
            assert stats.num_preemptions > 0
    finally:
        torch.set_num_threads(old)
    assert all(len(o.token_ids) == params.max_tokens for o in outs)
    return [list(o.token_ids) for o in outs]


def _case(model, dtype, prompts, params, case) -> list[list[int]]:
    kw = {"together": dict(chunk=2048, threads=1), "chunk64": dict(chunk=64, threads=1),
          "chunk16": dict(chunk=16, threads=1), "threads2": dict(chunk=2048, threads=2),
          "prefix_hit": dict(chunk=64, threads=2, repeat=2),
          # room for the longest request and a bit: the others are preempted to make room
          "preempted": dict(chunk=64, threads=1, kv_blocks=-(-(max(map(len, prompts)) + params.max_tokens) // 16) + 8),
          "beside_sampled": dict(chunk=64, threads=1, sampled=3)}[case]
    return _generate(model, dtype, prompts, params, **kw)


def _check(ref, got, case, dtype):
    bad = [i for i, (a, b) in enumerate(zip(ref, got)) if a != b]
    first = {i: next(j for j, (x, y) in enumerate(zip(ref[i], got[i])) if x != y) for i in bad}
    assert not bad, f"{dtype} {case}: {len(ref) - len(bad)}/{len(ref)} equal to the prompts run alone; " \
                    f"differ at token {first} (prompt index: first differing token)"


# ------------------------------------------------------------------ a random model of real shape
def _tiny(tmp_path_factory, arch: str, **overrides) -> str:
    from tests.tiny_models import save_tiny_model

    shape = dict(hidden_size=192, intermediate_size=512, num_hidden_layers=3, num_attention_heads=3,
                 num_key_value_heads=1, head_dim=64, max_position_embeddings=1024)
    return str(save_tiny_model(arch, tmp_path_factory.mktemp("bi") / arch, seed=3, **{**shape, **overrides}))


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory):
    return _tiny(tmp_path_factory, "llama")


TINY_GREEDY = SamplingParams(max_tokens=48, temperature=0, ignore_eos=True)


@pytest.fixture(scope="module")
def tiny_reference(tiny_folder):
    prompts = _prompts(10, seed=11)
    return prompts, {d: _generate(tiny_folder, d, prompts, TINY_GREEDY, chunk=2048, threads=1, alone=True)
                     for d in DTYPES if d == "float32" or _bf16_ok()}


@pytest.mark.parametrize("dtype", _dtype_params())
@pytest.mark.parametrize("case", CASES)
def test_tiny_model_tokens_do_not_depend_on_the_batch(tiny_folder, tiny_reference, dtype, case):
    prompts, ref = tiny_reference
    _check(ref[dtype], _case(tiny_folder, dtype, prompts, TINY_GREEDY, case), case, dtype)


# ------------------------------------------------------------------ the model's hidden states, bit for bit
def _metadata(chunks, tables, bs):
    """AttentionMetadata and positions for (context, q_len) chunks of sequences with these block tables."""
    from inferq.gpuworker.attention.base import AttentionMetadata

    slots, pos, qsl, seq_lens, ctx = [], [], [0], [], []
    for (c, n), table in zip(chunks, tables):
        pos += range(c, c + n)
        slots += [table[p // bs] * bs + p % bs for p in range(c, c + n)]
        qsl.append(qsl[-1] + n)
        seq_lens.append(c + n)
        ctx.append(c)
    bt = torch.zeros(len(chunks), max(len(t) for t in tables), dtype=torch.int32)
    for i, t in enumerate(tables):
        bt[i, : len(t)] = torch.tensor(t, dtype=torch.int32)
    i32 = lambda xs: torch.tensor(xs, dtype=torch.int32)  # noqa: E731
    q_lens = [n for _, n in chunks]
    meta = AttentionMetadata(
        slot_mapping=torch.tensor(slots, dtype=torch.int64), query_start_loc=i32(qsl), seq_lens=i32(seq_lens),
        context_lens=i32(ctx), block_tables=bt, max_query_len=max(q_lens), max_seq_len=max(seq_lens),
        block_size=bs, query_lens_cpu=q_lens, seq_lens_cpu=seq_lens, all_slots_valid=True)
    return meta, torch.tensor(pos, dtype=torch.int64)


def _continuous_batching(prompt_lens, total_lens, budget):
    """Steps of (sequence, start, end) as a continuous-batching scheduler makes them: every
    sequence past its prompt decodes one token a step, the rest of the token budget goes to
    prompt chunks in order."""
    done = [0] * len(prompt_lens)
    steps = []
    while any(d < t for d, t in zip(done, total_lens)):
        step, left = [], budget
        for s, (p, t) in enumerate(zip(prompt_lens, total_lens)):
            if done[s] >= p and done[s] < t and left > 0:
                step.append((s, done[s], done[s] + 1))
                left -= 1
        for s, p in enumerate(prompt_lens):
            if done[s] < p and left > 0:
                n = min(p - done[s], left)
                step.append((s, done[s], done[s] + n))
                left -= n
        for s, a, b in step:
            done[s] = b
        steps.append(step)
    return steps


def _drive(model, backend, seqs, steps, keep_last: bool, seed: int) -> dict:
    """Run the steps through the model over a fresh paged cache (blocks shuffled by seed);
    returns {(sequence, position): final hidden row} for every row the forward returns."""
    cfg = model.config
    bs = 16
    num_blocks = sum(-(-len(t) // bs) for t in seqs) + 4
    kv = backend.allocate_kv_cache(cfg.num_layers, num_blocks, bs, cfg.num_kv_heads, cfg.head_dim, model.dtype,
                                   torch.device("cpu"))
    free = list(range(num_blocks))
    random.Random(seed).shuffle(free)
    tables = [[free.pop() for _ in range(-(-len(t) // bs))] for t in seqs]
    got = {}
    for step in steps:
        meta, positions = _metadata([(a, b - a) for _, a, b in step], [tables[s] for s, _, _ in step], bs)
        ids = torch.tensor([tok for s, a, b in step for tok in seqs[s][a:b]], dtype=torch.int64)
        last = torch.tensor([p - 1 for p in meta.query_start_loc[1:].tolist()], dtype=torch.int64)
        hidden = model(ids, positions, kv, meta, keep_rows=last if keep_last else None)
        rows = [(s, b - 1) for s, _, b in step] if keep_last else [(s, p) for s, a, b in step for p in range(a, b)]
        assert hidden.shape[0] == len(rows)
        got.update({key: hidden[i].clone() for i, key in enumerate(rows)})
    return got


@pytest.mark.parametrize("dtype", _dtype_params())
@pytest.mark.parametrize("arch", ("llama", "qwen3", "qwen2"))
def test_tiny_model_hidden_states_do_not_depend_on_the_schedule(tiny_folder, tmp_path_factory, arch, dtype):
    """The model's final hidden states (what the LM head reads), for prompts with their
    continuations fed as decodes: each sequence alone vs continuous batching at budgets of
    2048, 64 and 16 tokens, on 1 and 2 threads, all rows and only each chunk's last row (the
    runner's keep_rows): the same bits for every (sequence, position) both runs computed.
    Llama (untied LM head, llama3 rope scaling), Qwen3 (per-head q/k RMSNorm, tied), Qwen2
    (q/k/v bias)."""
    folder = tiny_folder if arch == "llama" else _tiny(tmp_path_factory, arch)
    llm = LLM(model=folder, dtype=dtype, num_kv_blocks=8)
    model, backend = llm.engine.model, llm.engine.backend
    rng = random.Random(5)
    prompts = _prompts(8, seed=21)
    seqs = [p + [rng.randint(1000, 40000) for _ in range(12)] for p in prompts]
    plens, tlens = [len(p) for p in prompts], [len(t) for t in seqs]
    alone_steps = [step for s in range(len(seqs)) for step in
                   ([[(s, 0, plens[s])]] + [[(s, p, p + 1)] for p in range(plens[s], tlens[s])])]
    old = torch.get_num_threads()
    try:
        for keep_last in (False, True):
            torch.set_num_threads(1)
            ref = _drive(model, backend, seqs, alone_steps, keep_last, seed=0)
            for budget, nthreads in ((2048, 1), (64, 1), (16, 1), (16, 2), (2048, 2)):
                torch.set_num_threads(nthreads)
                got = _drive(model, backend, seqs, _continuous_batching(plens, tlens, budget), keep_last,
                             seed=budget + nthreads)
                common = sorted(set(ref) & set(got))
                assert len(common) >= sum(t - p for p, t in zip(plens, tlens)), "too few rows in common"
                bad = [key for key in common if not torch.equal(ref[key], got[key])]
                assert not bad, (f"{dtype} budget {budget} threads {nthreads} keep_last {keep_last}: "
                                 f"{len(bad)}/{len(common)} rows differ, e.g. (sequence, position) {bad[:5]}")
    finally:
        torch.set_num_threads(old)


@pytest.mark.parametrize("dtype", _dtype_params())
@pytest.mark.parametrize("arch", ("llama", "mistral"))
def test_a_vocabulary_off_32_keeps_the_lm_head_on_the_kernel(tmp_path_factory, arch, dtype):
    """A vocabulary that is not a multiple of 32 (49,157; tokens added to a base model): the LM
    head is packed with zero rows past it (on F.linear a row's logits would change with the
    number of rows), the logits have the vocabulary's width, each row equals itself alone, and
    they are F.linear's up to the kernels' rounding; untied (llama) and tied (mistral: the
    embedding reads its rows from the padded panels)."""
    from inferq.gpuworker.models.loader import load_model

    folder = _tiny(tmp_path_factory, arch, vocab_size=49157)
    plain = load_model(folder, dtype=getattr(torch, dtype)).model
    llm = LLM(model=folder, dtype=dtype, num_kv_blocks=8)
    model = llm.engine.model
    if model.packing in (None, "onednn"):
        pytest.skip("no matmul kernel here")
    assert model.packed_lm_head is not None and model.lm_head is None and model.logits_cols == 49157
    ids = torch.tensor([5, 49156, 300, 7])
    assert torch.equal(model.embed(ids), plain.embed(ids))
    hidden = torch.randn(20, model.config.hidden_size, generator=torch.Generator().manual_seed(0)).to(model.dtype)
    logits = model.lm_logits(hidden)
    assert logits.shape == (20, 49157) and logits.is_contiguous()
    for i in range(20):
        assert torch.equal(model.lm_logits(hidden[i : i + 1])[0], logits[i])
    ref = plain.lm_logits(hidden).float()
    assert (logits.float() - ref).abs().max().item() <= (1e-4 if dtype == "float32" else 0.02 * ref.abs().max().item())
    out = llm.generate([[5, 6, 7, 8]], SamplingParams(max_tokens=4, temperature=0, ignore_eos=True))[0]
    assert len(out.token_ids) == 4 and max(out.token_ids) < 49157


# ------------------------------------------------------------------ the bundled SmolLM2
SMOL_GREEDY = SamplingParams(max_tokens=40, temperature=0, ignore_eos=True)


@pytest.fixture(scope="module")
def smol_prompts():
    from transformers import AutoTokenizer

    from inferq.gpuworker.models.loader import bundled_model_path, converted_folder

    tok = AutoTokenizer.from_pretrained(converted_folder(bundled_model_path()))
    topics = ["the sea", "a red fox", "prime numbers", "Paris", "rain", "a lighthouse", "Redis streams",
              "bread", "the moon", "chess"]
    prompts = []
    for i, t in enumerate(topics):
        text = " ".join([f"Sentence {j} is about {t} and nothing else." for j in range(i * i // 2)])
        msg = [{"role": "user", "content": f"{text} Tell me about {t}."}]
        prompts.append(list(tok(tok.apply_chat_template(msg, tokenize=False, add_generation_prompt=True),
                                add_special_tokens=False).input_ids))
    return prompts


@pytest.fixture(scope="module")
def smol_reference(smol_prompts):
    return {d: _generate(None, d, smol_prompts, SMOL_GREEDY, chunk=2048, threads=1, alone=True)
            for d in DTYPES if d == "float32" or _bf16_ok()}


@pytest.mark.slow
@pytest.mark.parametrize("dtype", _dtype_params())
@pytest.mark.parametrize("case", ("together", "chunk16", "threads2", "prefix_hit", "preempted"))
def test_smollm2_tokens_do_not_depend_on_the_batch(smol_prompts, smol_reference, dtype, case):
    _check(smol_reference[dtype], _case(None, dtype, smol_prompts, SMOL_GREEDY, case), case, dtype)
