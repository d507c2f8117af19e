"""Sampler: greedy, truncation, sampling statistics, seeds, penalties, logprobs."""
from __future__ import annotations

import math

import pytest
import torch

from inferq.gpuworker.engine.keyed_draws import KeyedDraws
from inferq.gpuworker.engine.sampler import Sampler, SamplingRow
from inferq.schemas import SamplingParams

torch.set_num_threads(1)
sampler = Sampler()


def row(prompt=(1, 2), output=(), generator=None, **kw) -> SamplingRow:
    return SamplingRow(SamplingParams(**kw), list(prompt), list(output), generator)


def random_logits(n: int, vocab: int = 500, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, vocab, generator=g) * 3


def counts_of(tokens: list[int], vocab: int) -> torch.Tensor:
    return torch.bincount(torch.tensor(tokens), minlength=vocab).double()


def assert_frequencies(tokens: list[int], expected: torch.Tensor) -> None:
    """Each token's frequency within 5 standard deviations of a binomial."""
    n = len(tokens)
    got = counts_of(tokens, expected.numel()) / n
    sd = torch.sqrt(expected * (1 - expected) / n)
    bound = 5 * sd + 1e-9  # zero-probability tokens must never appear
    assert torch.all((got - expected).abs() <= bound), (got, expected)


# ----------------------------------------------------------------------- greedy
def test_greedy_is_argmax_of_whole_batch():
    logits = random_logits(8)
    out = sampler(logits, [row(temperature=0.0) for _ in range(8)])
    assert out.token_ids == logits.argmax(-1).tolist()
    assert out.logprobs == [None] * 8


def test_greedy_rows_in_a_mixed_batch_stay_exact_argmax():
    logits = random_logits(6, seed=1)
    rows = [row(temperature=0.0) if i % 2 == 0 else row(temperature=1.5, top_p=0.9) for i in range(6)]
    out = sampler(logits, rows)
    argmax = logits.argmax(-1).tolist()
    assert [out.token_ids[i] for i in (0, 2, 4)] == [argmax[i] for i in (0, 2, 4)]


def test_top_k_one_equals_greedy():
    logits = random_logits(16, seed=2)
    torch.manual_seed(0)
    out = sampler(logits, [row(temperature=2.0, top_k=1) for _ in range(16)])
    assert out.token_ids == logits.argmax(-1).tolist()


def test_tiny_top_p_equals_greedy():
    logits = random_logits(16, seed=3)
    torch.manual_seed(0)
    out = sampler(logits, [row(temperature=1.0, top_p=1e-6) for _ in range(16)])
    assert out.token_ids == logits.argmax(-1).tolist()


def test_sampler_does_not_modify_callers_logits():
    logits = random_logits(3, seed=4)
    before = logits.clone()
    sampler(logits, [row(temperature=0.7, repetition_penalty=1.5, frequency_penalty=1.0, top_k=5) for _ in range(3)])
    assert torch.equal(logits, before)


def test_shape_mismatch_is_a_clear_error():
    with pytest.raises(ValueError, match="one row per SamplingRow"):
        sampler(random_logits(3), [row()])


# --------------------------------------------------------------- distributions
DRAWS = 20_000


def draw_many(logits_row: torch.Tensor, **kw) -> list[int]:
    torch.manual_seed(1234)
    batch = logits_row.expand(DRAWS, -1).contiguous()
    one = row(**kw)  # rows are read-only to the sampler: one object serves every draw
    return sampler(batch, [one] * DRAWS).token_ids


BASE = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0, -3.0])


def test_temperature_sampling_follows_softmax():
    for temp in (0.5, 1.0, 1.7):
        tokens = draw_many(BASE, temperature=temp)
        assert_frequencies(tokens, torch.softmax(BASE.double() / temp, -1))


def test_top_k_keeps_exactly_k_and_renormalises():
    tokens = draw_many(BASE, temperature=1.0, top_k=3)
    expected = torch.softmax(BASE.double(), -1)
    expected[3:] = 0
    assert_frequencies(tokens, expected / expected.sum())
    assert set(tokens) == {0, 1, 2}


def test_top_p_keeps_the_smallest_nucleus_reaching_p():
    probs = torch.softmax(BASE.double(), -1)  # ~[.55, .20, .12, .07, .03, .00]
    # top_p just above the first two probabilities' sum: the third is needed too.
    p = float(probs[:2].sum()) + 0.01
    tokens = draw_many(BASE, temperature=1.0, top_p=p)
    expected = probs.clone()
    expected[3:] = 0
    assert_frequencies(tokens, expected / expected.sum())
    assert set(tokens) == {0, 1, 2}


def test_min_p_drops_tokens_below_fraction_of_best():
    probs = torch.softmax(BASE.double(), -1)
    min_p = 0.3  # keeps tokens with p >= 0.3 * p_max: ids 0 and 1 (0.37) but not 2 (0.22)
    assert probs[1] >= min_p * probs[0] > probs[2]
    tokens = draw_many(BASE, temperature=1.0, min_p=min_p)
    expected = probs.clone()
    expected[2:] = 0
    assert_frequencies(tokens, expected / expected.sum())


def test_top_k_then_top_p_apply_in_that_order():
    # After top-k=2 the renormalised pair is ~[.73, .27]; top_p=0.7 then keeps
    # only the first. (top-p first would have kept two tokens.)
    tokens = draw_many(BASE, temperature=1.0, top_k=2, top_p=0.7)
    assert set(tokens) == {0}


# ----------------------------------------------------------------------- seeds
def seeded_run(seed: int, steps: int = 30, neighbours: int = 0, position: int = 0) -> list[int]:
    """Sample ``steps`` tokens for one seeded request placed among neighbours.

    The request's own logits are the same in every run; the neighbours (half
    seeded, half on the global RNG) get logits that differ from run to run.
    """
    others = [1000 + k if k % 2 else None for k in range(neighbours)]
    got = []
    for step in range(steps):
        logits = random_logits(neighbours + 1, vocab=300, seed=10_000 * (neighbours + 1) + step)
        logits[position] = random_logits(1, vocab=300, seed=step)[0]
        # Each step is output token ``step``: its draws are keyed by (seed, step).
        rows = [row(temperature=1.0, generator=None if s is None else KeyedDraws(s, step)) for s in others]
        rows.insert(position, row(temperature=1.0, seed=seed, generator=KeyedDraws(seed, step)))
        got.append(sampler(logits, rows).token_ids[position])
    return got


def test_same_seed_same_tokens_on_rerun():
    assert seeded_run(7) == seeded_run(7)


def test_different_seeds_differ():
    assert seeded_run(7) != seeded_run(8)


def test_seeded_row_independent_of_batch_neighbours():
    alone = seeded_run(42)
    assert seeded_run(42, neighbours=5, position=3) == alone
    torch.manual_seed(999)  # the global RNG state must not matter either
    assert seeded_run(42, neighbours=2, position=0) == alone


def test_keyed_draws_depend_on_seed_and_token_index_only():
    def draws(seed, index, n=4):
        d = KeyedDraws(seed, index)
        return [d.next_uniform() for _ in range(n)]

    a = draws(7, 3)
    assert a == draws(7, 3) and a != draws(7, 4) and a != draws(8, 3)
    assert len(set(a)) == 4 and all(0.0 <= x < 1.0 for x in a)
    many = [x for i in range(2000) for x in draws(11, i, 2)]
    assert abs(sum(many) / len(many) - 0.5) < 0.02  # uniform enough to sample with


# ------------------------------------------------------------------- penalties
RAW = torch.tensor([[2.0, -1.0, 0.5, 3.0, -2.0]])


def penalised_logprobs(**kw) -> dict[int, float]:
    # Penalised logits are what processed logprobs report for a greedy row (raw ones are the default).
    out = sampler(RAW.clone(), [row(prompt=[0], output=[1, 1, 2], temperature=0.0, logprobs=5,
                                    logprobs_mode="processed_logprobs", **kw)])
    return out.logprobs[0]


def assert_logprobs_of(got: dict[int, float], logits: list[float]) -> None:
    want = torch.log_softmax(torch.tensor(logits, dtype=torch.float64), -1)
    for tid, lp in got.items():
        assert lp == pytest.approx(float(want[tid]), abs=1e-5)
    assert set(got) == set(range(len(logits)))


def test_repetition_penalty_divides_positive_multiplies_negative():
    # Seen tokens: 0 (prompt), 1 and 2 (output). 3 and 4 were never seen.
    got = penalised_logprobs(repetition_penalty=2.0)
    assert_logprobs_of(got, [1.0, -2.0, 0.25, 3.0, -2.0])


def test_frequency_penalty_scales_with_output_count_only():
    got = penalised_logprobs(frequency_penalty=0.5)
    # Prompt token 0 is untouched; token 1 appeared twice, token 2 once.
    assert_logprobs_of(got, [2.0, -2.0, 0.0, 3.0, -2.0])


def test_presence_penalty_is_flat_for_any_output_token():
    got = penalised_logprobs(presence_penalty=0.3)
    assert_logprobs_of(got, [2.0, -1.3, 0.2, 3.0, -2.0])


def test_all_penalties_compose_repetition_first():
    got = penalised_logprobs(repetition_penalty=2.0, frequency_penalty=0.5, presence_penalty=0.3)
    assert_logprobs_of(got, [1.0, -2.0 - 1.0 - 0.3, 0.25 - 0.5 - 0.3, 3.0, -2.0])


def test_penalty_changes_the_greedy_choice():
    logits = torch.tensor([[5.0, 4.0, 0.0]])
    assert sampler(logits, [row(output=[0], temperature=0.0)]).token_ids == [0]
    assert sampler(logits, [row(output=[0], temperature=0.0, frequency_penalty=2.0)]).token_ids == [1]
    assert sampler(logits, [row(prompt=[0], temperature=0.0, repetition_penalty=1.5)]).token_ids == [1]


def test_penalties_apply_only_to_rows_that_ask():
    logits = RAW.expand(2, -1).contiguous()
    rows = [
        row(prompt=[0], output=[1, 1, 2], temperature=0.0, logprobs=5, frequency_penalty=0.5,
            logprobs_mode="processed_logprobs"),
        row(prompt=[0], output=[1, 1, 2], temperature=0.0, logprobs=5, logprobs_mode="processed_logprobs"),
    ]
    out = sampler(logits, rows)
    assert_logprobs_of(out.logprobs[0], [2.0, -2.0, 0.0, 3.0, -2.0])
    assert_logprobs_of(out.logprobs[1], RAW[0].tolist())


def reference_penalised(logits: torch.Tensor, rows: list[SamplingRow]) -> torch.Tensor:
    """Penalties computed the plain way, row by row from the token lists (vLLM's order)."""
    out = logits.clone()
    vocab = logits.shape[1]
    for i, r in enumerate(rows):
        p = r.params
        seen = {t for t in list(r.prompt_token_ids) + list(r.output_token_ids) if 0 <= t < vocab}
        for t in seen:
            if p.repetition_penalty != 1.0:
                v = out[i, t]
                out[i, t] = v / p.repetition_penalty if v > 0 else v * p.repetition_penalty
        for t in set(r.output_token_ids):
            if 0 <= t < vocab:
                out[i, t] -= p.frequency_penalty * r.output_token_ids.count(t) + p.presence_penalty
    return out


def test_penalty_history_kept_across_steps_matches_the_token_lists():
    # The engine keeps each request's history (PenaltyTokens) across steps and
    # appends one token a step; every step must penalise exactly as if the history
    # were rebuilt from the lists. Prompts repeat ids and hold ids past the vocab.
    from inferq.gpuworker.engine.penalty_tokens import PenaltyTokens

    vocab = 20  # logprobs of the whole vocabulary (at most MAX_LOGPROBS) show every penalised logit
    g = torch.Generator().manual_seed(3)
    kinds = [dict(repetition_penalty=1.3), dict(frequency_penalty=0.4, presence_penalty=0.2),
             dict(repetition_penalty=0.8, frequency_penalty=-0.3, presence_penalty=0.5), dict()]
    rows = []
    for k, kw in enumerate(kinds * 2):
        prompt = torch.randint(0, vocab + 5, (50 + 7 * k,), generator=g).tolist()
        r = row(prompt=prompt, output=[], temperature=0.0, logprobs=vocab, logprobs_mode="processed_logits", **kw)
        if r.params.uses_penalties:
            r.penalty_tokens = PenaltyTokens(r.prompt_token_ids, vocab, "cpu",
                                             with_prompt=r.params.repetition_penalty != 1.0)
        rows.append(r)
    for step in range(70):  # past the history's first 64-token buffer
        logits = torch.randn(len(rows), vocab, generator=g) * 4
        want = reference_penalised(logits, rows)
        out = sampler(logits.clone(), rows)
        for i, r in enumerate(rows):
            got = torch.full((vocab,), float("nan"))
            for t, v in out.logprobs[i].items():
                got[t] = v
            assert torch.allclose(got, want[i], atol=1e-5), (step, i)
            assert out.token_ids[i] == int(want[i].argmax())
            r.output_token_ids.append(out.token_ids[i] if step % 3 else int(r.prompt_token_ids[step % 50] % vocab))


# -------------------------------------------------------------------- logprobs
def test_logprobs_are_sorted_top_n_log_softmax():
    logits = random_logits(4, vocab=200, seed=9)
    out = sampler(logits, [row(temperature=0.0, logprobs=n) for n in (1, 3, 5, 20)])
    ref = torch.log_softmax(logits.double(), -1)
    for i, n in enumerate((1, 3, 5, 20)):
        d = out.logprobs[i]
        assert len(d) == n
        values = list(d.values())
        assert values == sorted(values, reverse=True)
        assert list(d) == ref[i].topk(n).indices.tolist()
        for tid, lp in d.items():
            assert lp == pytest.approx(float(ref[i, tid]), abs=1e-5)
        assert out.token_ids[i] in d


def test_logprobs_zero_gives_only_the_sampled_token():
    logits = random_logits(2, vocab=50, seed=10)
    out = sampler(logits, [row(temperature=0.0, logprobs=0), row(temperature=0.0)])
    assert list(out.logprobs[0]) == [out.token_ids[0]]
    assert out.logprobs[1] is None


def test_sampled_token_outside_top_n_is_included():
    # Flat-ish logits at high temperature: the sampled token is rarely the best.
    logits = random_logits(32, vocab=100, seed=11) * 0.1
    rows = [row(temperature=2.0, logprobs=2, seed=s, generator=KeyedDraws(s, 0)) for s in range(32)]
    out = sampler(logits, rows)
    ref = torch.log_softmax(logits.double(), -1)
    outside = 0
    for i, d in enumerate(out.logprobs):
        top2 = ref[i].topk(2).indices.tolist()
        tok = out.token_ids[i]
        assert tok in d and d[tok] == pytest.approx(float(ref[i, tok]), abs=1e-5)
        assert list(d)[:2] == top2
        if tok not in top2:
            outside += 1
            assert len(d) == 3
    assert outside > 0


def test_logprobs_are_before_temperature():
    logits = random_logits(1, vocab=30, seed=12)
    out = sampler(logits, [row(temperature=0.3, logprobs=3, seed=1, generator=KeyedDraws(1, 0))])
    ref = torch.log_softmax(logits.double(), -1)[0]
    for tid, lp in out.logprobs[0].items():
        assert lp == pytest.approx(float(ref[tid]), abs=1e-5)
    assert math.isfinite(sum(out.logprobs[0].values()))


@pytest.mark.parametrize("nucleus", [300, 3000, 9000])
def test_wide_nucleus_is_exact_whatever_its_size(nucleus):
    """Top-p over a large, nearly flat vocabulary: partial sorts must widen as needed."""
    vocab = 10_000
    logits = -torch.arange(vocab, dtype=torch.float64) * 1e-5  # distinct, nearly uniform
    probs = torch.softmax(logits, -1)
    # top_p halfway through token `nucleus - 1`: exactly `nucleus` tokens are kept.
    top_p = float(probs[: nucleus - 1].sum() + probs[nucleus - 1] / 2)
    torch.manual_seed(5)
    one = row(temperature=1.0, top_p=top_p)
    tokens = sampler(logits.float().expand(1000, -1).contiguous(), [one] * 1000).token_ids
    assert max(tokens) < nucleus
    assert max(tokens) >= nucleus * 0.98  # tokens near the edge of the nucleus do get drawn


def test_top_k_alone_on_a_large_vocabulary():
    logits = random_logits(1, vocab=5000, seed=13)[0]
    torch.manual_seed(6)
    one = row(temperature=3.0, top_k=40)
    tokens = set(sampler(logits.expand(2000, -1).contiguous(), [one] * 2000).token_ids)
    assert tokens == set(logits.topk(40).indices.tolist())


def test_draw_never_lands_on_a_zero_probability_token():
    from inferq.gpuworker.engine.sampler import _draw

    logits = torch.tensor([[1.0, 2.0, float("-inf"), float("-inf")], [float("-inf"), 0.0, 0.0, float("-inf")]])
    for u in (0.0, 0.5, 1.0 - 1e-7, 1.0):
        picked = _draw(logits, torch.tensor([u, u])).tolist()
        assert picked[0] in (0, 1) and picked[1] in (1, 2)


# ------------------------------------------------------------ blocked argmax
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("vocab", [7, 1024, 1025, 1536, 49152, 50_003])
def test_greedy_argmax_equals_argmax_ties_included(dtype, vocab):
    from inferq.gpuworker.engine.sampler import greedy_argmax

    g = torch.Generator().manual_seed(vocab)
    x = (torch.randn(40, vocab, generator=g) * 0.3).to(dtype)  # low precision: many ties
    x[0] = 1.0  # every logit tied: index 0
    x[1, -1] = 50.0  # the maximum in the short last block
    x[2, -3:] = 50.0  # tied maxima inside the last block
    x[3, 5] = x[3, vocab // 2] = x[3, -1] = 60.0  # tied maxima in different blocks
    got = greedy_argmax(x)
    assert got.tolist() == x.argmax(dim=-1).tolist() == x.max(dim=-1).indices.tolist()
    assert got.dtype == torch.long
    assert greedy_argmax(x[3:4]).tolist() == x[3:4].argmax(dim=-1).tolist()  # the one-row path


def test_greedy_argmax_on_a_column_slice_and_nan_rows():
    from inferq.gpuworker.engine.sampler import greedy_argmax

    x = torch.randn(6, 4000, generator=torch.Generator().manual_seed(1))
    x[2, 1234] = float("nan")
    view = x[:, :3000]  # rows not contiguous in memory
    assert greedy_argmax(view).tolist() == view.argmax(dim=-1).tolist()
    assert greedy_argmax(view)[2] == 1234


# ---------------------------------------------- top-p by rejection (no sorting)
def test_nucleus_of_three_in_a_flat_row_needs_many_pivots_and_stays_exact(monkeypatch):
    """Top-p keeping 3 of 6,000 nearly equal tokens: most first draws are rejected,
    the pivoted redraws (and, with no rounds allowed, the sorted fallback) must give
    the renormalised three-token distribution."""
    import inferq.gpuworker.engine.sampler as smp

    vocab = 6000
    logits = -torch.arange(vocab, dtype=torch.float64) * 1e-4
    probs = torch.softmax(logits, -1)
    top_p = float(probs[:2].sum() + probs[2] / 2)  # exactly three tokens kept
    expected = torch.zeros(vocab, dtype=torch.float64)
    expected[:3] = probs[:3] / probs[:3].sum()
    batch = logits.float().expand(1500, -1).contiguous()
    for rounds in (smp._MAX_ROUNDS, 0):
        monkeypatch.setattr(smp, "_MAX_ROUNDS", rounds)
        torch.manual_seed(21)
        tokens = sampler(batch, [row(temperature=1.0, top_p=top_p)] * 1500).token_ids
        assert set(tokens) <= {0, 1, 2}
        assert_frequencies(tokens, expected)


def test_nucleus_ties_are_ranked_by_token_id():
    # Token 0 holds ~0.46; tokens 1..4 are tied at ~0.135. top_p = 0.55 keeps token 0
    # and exactly one tied token: the lowest id.
    logits = torch.tensor([2.0, 0.77, 0.77, 0.77, 0.77, -9.0, -9.0])
    probs = torch.softmax(logits.double(), -1)
    assert probs[0] < 0.55 < probs[0] + probs[1]
    tokens = draw_many(logits, temperature=1.0, top_p=0.55)
    assert set(tokens) == {0, 1}
    expected = torch.zeros(7, dtype=torch.float64)
    expected[:2] = probs[:2] / probs[:2].sum()
    assert_frequencies(tokens, expected)


def test_nucleus_with_min_p_and_temperature_over_a_large_vocabulary():
    """Chunked fast path with the block-wise inverse CDF (vocab > 4 blocks) against
    a float64 reference: temperature, then min-p, then top-p."""
    vocab = 3000
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(vocab, generator=g, dtype=torch.float64) * 2
    t, min_p, top_p = 0.7, 0.01, 0.8
    x = logits / t
    p = torch.softmax(x, -1)
    x = x.masked_fill(p < min_p * p.max(), float("-inf"))
    p = torch.softmax(x, -1)
    vals, order = p.sort(descending=True)
    keep = (vals.cumsum(-1) - vals) < top_p
    ref = torch.zeros(vocab, dtype=torch.float64)
    ref[order[keep]] = vals[keep]
    ref /= ref.sum()
    torch.manual_seed(4)
    n = 10_000
    tokens = sampler(logits.float().expand(n, -1).contiguous(),
                     [row(temperature=t, min_p=min_p, top_p=top_p)] * n).token_ids
    assert float(ref[tokens].min()) > 0  # nothing outside the kept set
    got = counts_of(tokens, vocab) / n
    bound = 4 * 0.5 * float(torch.sqrt(ref * (1 - ref) / n).sum())
    assert 0.5 * float((got - ref).abs().sum()) <= bound


def test_block_draw_equals_a_full_cumsum_draw():
    from inferq.gpuworker.engine.sampler import _draw_unnormalised

    g = torch.Generator().manual_seed(8)
    for vocab in (2048, 2049, 5000):
        e = torch.rand(64, vocab, generator=g, dtype=torch.float64)
        e[e < 0.3] = 0.0  # zero-weight tokens must never come out
        e[0, : vocab - 1] = 0.0  # only the very last token has weight
        u = torch.rand(64, generator=g, dtype=torch.float64)
        u[1], u[2] = 0.0, 1.0 - 1e-12
        tok, total = _draw_unnormalised(e, u)
        cdf = e.cumsum(-1)
        ref = torch.searchsorted(cdf, (u * cdf[:, -1])[:, None], right=True)[:, 0]
        assert torch.equal(tok, torch.minimum(ref, torch.tensor(vocab - 1)))
        assert bool((e.gather(1, tok[:, None]) > 0).all())
        assert torch.allclose(total, cdf[:, -1])


@pytest.mark.parametrize("top_p", [0.9, 0.3])
def test_seeded_top_p_row_independent_of_neighbours_and_rejections(top_p):
    """A seeded top-p row draws the same tokens whatever its neighbours, even when
    its first draws are rejected (extra uniforms come from its own generator)."""
    def run(neighbours: int, position: int) -> list[int]:
        got = []
        for step in range(25):
            logits = random_logits(neighbours + 1, vocab=2500, seed=500 + step) * 0.05  # flat: many rejections
            logits[position] = random_logits(1, vocab=2500, seed=step)[0] * 0.05
            rows = [row(temperature=1.0, top_p=0.5, top_k=(7 if k % 3 == 0 else -1)) for k in range(neighbours)]
            rows.insert(position, row(temperature=1.0, top_p=top_p, seed=11, generator=KeyedDraws(11, step)))
            got.append(sampler(logits, rows).token_ids[position])
        return got

    alone = run(0, 0)
    assert run(20, 13) == alone  # more than one chunk, mixed with top-k rows
    torch.manual_seed(3)
    assert run(3, 1) == alone


def test_owned_logits_are_penalised_in_place_only_when_nobody_reads_them_raw():
    logits = random_logits(3, vocab=50, seed=4)
    rows = [row(prompt=[1, 2, 3], output=[4, 4], temperature=0.0, repetition_penalty=1.5, frequency_penalty=0.5),
            row(prompt=[5], output=[6], temperature=0.0, presence_penalty=0.7), row(temperature=0.0)]
    kept = logits.clone()
    want = sampler(logits, rows).token_ids
    assert torch.equal(logits, kept)  # not handed over: the caller's tensor is untouched
    handed = logits.clone()
    assert sampler(handed, rows, owned=True).token_ids == want
    assert not torch.equal(handed, kept)  # handed over: penalised in place, no 50 MB copy
    # A row reporting raw logprobs needs the unpenalised logits: copied even when owned.
    raw_rows = rows[:2] + [row(temperature=0.0, logprobs=2)]
    handed = logits.clone()
    out = sampler(handed, raw_rows, owned=True)
    assert torch.equal(handed, kept)
    assert out.token_ids == sampler(logits.clone(), raw_rows).token_ids
