"""The sampler against a reference of vLLM V1's order, on fixed logits.

Reference (float64, written from vLLM V1's documented order): penalties
(repetition, frequency, presence) -> temperature -> min-p (on the softmax after
temperature) -> top-k -> top-p (vLLM's ascending-sort form: drop the smallest
tokens while their cumulative mass <= 1 - p, never the best) -> softmax.

Bound: total-variation distance between the empirical distribution of N seeded
draws and the reference, at most 4 x sum_i sqrt(p_i (1 - p_i) / N) / 2 (four
times the expected sampling error's scale; the draws are seeded, so the test is
deterministic). Tokens the reference gives probability 0 must never be drawn. Each
case also checks the bound is tight enough to tell vLLM's order from the old
one (min-p after top-k/top-p).
"""
from __future__ import annotations

import math

import pytest
import torch

from inferq.gpuworker.engine.keyed_draws import KeyedDraws
from inferq.gpuworker.engine.sampler import Sampler, SamplingRow
from inferq.schemas import SamplingParams

torch.set_num_threads(1)
sampler = Sampler()
N = 20_000


def reference_probs(logits: torch.Tensor, p: SamplingParams, prompt: list[int], output: list[int],
                    min_p_last: bool = False) -> torch.Tensor:
    x = logits.double().clone()
    if p.repetition_penalty != 1.0:
        for t in set(prompt) | set(output):
            x[t] = x[t] / p.repetition_penalty if x[t] > 0 else x[t] * p.repetition_penalty
    for t in set(output):
        x[t] -= p.frequency_penalty * output.count(t) + p.presence_penalty
    x = x / p.temperature

    def min_p(x):
        if p.min_p > 0:
            probs = torch.softmax(x, -1)
            x = x.masked_fill(probs < p.min_p * probs.max(), -math.inf)
        return x

    if not min_p_last:
        x = min_p(x)
    if 0 < p.top_k < x.numel():
        kth = x.sort(descending=True).values[p.top_k - 1]
        x = x.masked_fill(x < kth, -math.inf)
    if p.top_p < 1.0:
        vals, order = x.sort()  # ascending
        cum = torch.softmax(vals, -1).cumsum(-1)
        drop = cum <= 1 - p.top_p
        drop[-1] = False
        x = x.clone()
        x[order[drop]] = -math.inf
    if min_p_last:
        x = min_p(x)
    return torch.softmax(x, -1)


def empirical(logits: torch.Tensor, params: SamplingParams, prompt, output, seed: int) -> torch.Tensor:
    torch.manual_seed(seed)
    rows = [SamplingRow(params, list(prompt), list(output)) for _ in range(N)]
    tokens = sampler(logits[None, :].expand(N, -1).contiguous(), rows).token_ids
    return torch.bincount(torch.tensor(tokens), minlength=logits.numel()).double() / N


def tv(a: torch.Tensor, b: torch.Tensor) -> float:
    return 0.5 * float((a - b).abs().sum())


def bound(ref: torch.Tensor) -> float:
    return 4 * 0.5 * float(torch.sqrt(ref * (1 - ref) / N).sum())


def fixed_logits(vocab: int = 64, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(vocab, generator=g) * 2


def order_sensitive_logits() -> torch.Tensor:
    """A head of five tokens (0.3, ~0.1 x4) and a 300-token tail holding 0.3: min-p
    removes the tail, which changes what a top-p nucleus keeps."""
    g = torch.Generator().manual_seed(1)
    head = torch.tensor([0.3, 0.1, 0.099, 0.098, 0.097])
    tail = torch.full((300,), (1 - float(head.sum())) / 300) * (1 + 0.01 * torch.rand(300, generator=g))
    return torch.log(torch.cat([head, tail])).float()


CASES = {
    # min-p before top-p: min-p removes the tail, so top-p's nucleus (over what is left) is smaller.
    "min_p+top_p": dict(temperature=1.0, min_p=0.08, top_p=0.6),
    "min_p+top_k": dict(temperature=0.7, min_p=0.2, top_k=5),
    "temperature+min_p+top_k+top_p": dict(temperature=1.5, min_p=0.05, top_k=12, top_p=0.8),
    "penalties+all": dict(temperature=1.2, repetition_penalty=1.3, frequency_penalty=0.4, presence_penalty=0.3,
                          min_p=0.05, top_k=20, top_p=0.9),
    "plain": dict(temperature=0.8),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_sampler_matches_vllm_v1_order(name):
    kw = CASES[name]
    params = SamplingParams(**kw)
    logits = order_sensitive_logits() if name == "min_p+top_p" else fixed_logits(seed=len(name))
    prompt, output = [0, 1, 2, 3], [1, 4, 4, 5, 6]
    ref = reference_probs(logits, params, prompt, output)
    got = empirical(logits, params, prompt, output, seed=7)
    assert float(got[ref == 0].sum()) == 0.0, "a token outside vLLM's kept set was drawn"
    b = bound(ref)
    assert tv(got, ref) <= b, (name, tv(got, ref), b)


def test_bound_tells_vllm_order_from_min_p_last():
    """The old order (min-p after top-k/top-p) is far outside the bound on these logits."""
    params = SamplingParams(temperature=1.0, min_p=0.08, top_p=0.6)
    logits = order_sensitive_logits()
    ref = reference_probs(logits, params, [], [])
    old = reference_probs(logits, params, [], [], min_p_last=True)
    assert tv(ref, old) > 3 * bound(ref), (tv(ref, old), bound(ref))


# ------------------------------------------------------------- logprob modes
def one(params: SamplingParams, logits: torch.Tensor, prompt=(0, 1), output=(1, 2, 2)):
    row = SamplingRow(params, list(prompt), list(output), KeyedDraws(3, 0))
    out = sampler(logits[None, :].clone(), [row])
    return out.token_ids[0], out.logprobs[0]


def test_raw_logprobs_are_the_models_own_distribution_by_default():
    logits = fixed_logits(seed=1)
    p = SamplingParams(temperature=0.5, top_k=3, min_p=0.1, frequency_penalty=1.0, logprobs=5, seed=3)
    assert p.logprobs_mode == "raw_logprobs"
    tok, d = one(p, logits)
    raw = torch.log_softmax(logits.double(), -1)
    assert list(d)[:5] == raw.topk(5).indices.tolist()
    for t, v in d.items():
        assert v == pytest.approx(float(raw[t]), abs=1e-5)


def test_raw_logits_mode_returns_the_logits():
    logits = fixed_logits(seed=2)
    tok, d = one(SamplingParams(temperature=0.0, logprobs=4, logprobs_mode="raw_logits",
                                repetition_penalty=2.0), logits)
    assert list(d)[:4] == logits.topk(4).indices.tolist()
    for t, v in d.items():
        assert v == pytest.approx(float(logits[t]), abs=1e-6)


def test_processed_logprobs_are_the_distribution_drawn_from():
    logits = fixed_logits(seed=3)
    kw = dict(temperature=0.7, top_k=6, min_p=0.05, top_p=0.9, presence_penalty=0.5, repetition_penalty=1.2)
    p = SamplingParams(logprobs=10, logprobs_mode="processed_logprobs", seed=3, **kw)
    ref = reference_probs(logits, p, [0, 1], [1, 2, 2])
    tok, d = one(p, logits)
    assert ref[tok] > 0
    kept = int((ref > 0).sum())
    assert 1 <= kept <= 6
    # The kept tokens come first with log of their reference probability; the rest are -inf.
    for t, v in list(d.items())[:kept]:
        assert v == pytest.approx(math.log(float(ref[t])), abs=1e-5)
    assert all(v == -math.inf for v in list(d.values())[kept:10])
    assert d[tok] == pytest.approx(math.log(float(ref[tok])), abs=1e-5)


def test_processed_logits_are_scaled_and_masked():
    logits = fixed_logits(seed=4)
    p = SamplingParams(temperature=2.0, top_k=3, logprobs=5, logprobs_mode="processed_logits", seed=1)
    tok, d = one(p, logits, output=())
    top3 = logits.topk(3)
    assert list(d)[:3] == top3.indices.tolist()
    for t, v in zip(top3.indices.tolist(), top3.values.tolist()):
        assert d[t] == pytest.approx(v / 2.0, abs=1e-6)
    assert all(v == -math.inf for v in list(d.values())[3:])


def test_modes_mix_in_one_batch():
    logits = torch.stack([fixed_logits(seed=5)] * 4)
    modes = ["raw_logprobs", "raw_logits", "processed_logprobs", "processed_logits"]
    rows = [SamplingRow(SamplingParams(temperature=t, top_k=4, logprobs=2, logprobs_mode=m), [0], [])
            for m, t in zip(modes, (1.0, 0.0, 0.0, 1.0))]
    torch.manual_seed(0)
    out = sampler(logits, rows)
    raw_lp = torch.log_softmax(logits[0].double(), -1)
    t0 = out.token_ids[0]
    assert out.logprobs[0][t0] == pytest.approx(float(raw_lp[t0]), abs=1e-5)
    t1 = out.token_ids[1]
    assert out.logprobs[1][t1] == pytest.approx(float(logits[1, t1]), abs=1e-6)
    # greedy + processed: no penalties here, so processed logprobs equal the raw ones
    t2 = out.token_ids[2]
    assert out.logprobs[2][t2] == pytest.approx(float(raw_lp[t2]), abs=1e-5)
    t3 = out.token_ids[3]
    assert out.logprobs[3][t3] == pytest.approx(float(logits[3, t3]), abs=1e-6)
