"""Sampled acceptance keeps the target distribution (statistically), and the
n-gram lookup proposes what followed the latest earlier match."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from inferq.gpuworker.engine.sampler import Sampler, SamplingRow
from inferq.gpuworker.engine.speculative.ngram import NgramProposer, lookup
from inferq.gpuworker.engine.speculative.verify import expand_rows, split_rows
from inferq.schemas import SamplingParams


class _Req:
    """What split_rows reads of a request: its proposal."""

    def __init__(self, drafts):
        self.spec_token_ids = drafts


def _emit(logits_rows: torch.Tensor, drafts: list[int], trials: int, params: SamplingParams) -> list[list[int]]:
    """``trials`` independent verifications of ``drafts`` against fixed target logits
    (one row per position), through the engine's own sampler and acceptance."""
    reqs = [_Req(drafts) for _ in range(trials)]
    rows, offsets = expand_rows(reqs, [len(drafts)] * trials)
    logits = logits_rows.repeat(trials, 1)
    sampler_rows = [SamplingRow(params=params, prompt_token_ids=[0], output_token_ids=[]) for _ in rows]
    out = Sampler()(logits, sampler_rows)
    tokens, _ = split_rows(out.token_ids, out.logprobs, reqs, [len(drafts)] * trials)
    return tokens


def _chi2_ok(counts: np.ndarray, probs: np.ndarray) -> bool:
    """Pearson chi-square against the expected counts, at a 1e-4 false-alarm level
    (critical values for the degrees of freedom used here)."""
    n = counts.sum()
    keep = probs * n >= 5
    expected = probs[keep] * n
    stat = float(((counts[keep] - expected) ** 2 / expected).sum())
    critical = {3: 21.1, 4: 23.5, 5: 25.7, 6: 27.9, 7: 29.9}[int(keep.sum()) - 1]
    return stat < critical


@pytest.mark.parametrize("params", [SamplingParams(temperature=1.0), SamplingParams(temperature=0.7, top_p=0.9),
                                    SamplingParams(temperature=1.3, top_k=5)])
def test_every_emitted_position_follows_the_target_distribution(params):
    torch.manual_seed(0)
    vocab = 8
    logits = torch.tensor([[2.0, 1.5, 1.0, 0.5, 0.0, -0.5, -1.0, -1.5],
                           [0.0, 1.0, 2.0, 0.3, 0.1, -1.0, 0.5, 0.2],
                           [1.0, 0.0, 0.0, 1.0, 0.5, 0.5, 2.0, -1.0]])
    drafts = [1, 2]  # the second-best token first, then the best
    emitted = _emit(logits, drafts, 60_000, params)
    # The target distribution of each position after what the sampler does to it.
    target = []
    for row in logits:
        t = row / params.temperature
        if 0 < params.top_k < vocab:
            t = torch.where(t >= t.topk(params.top_k).values[-1], t, float("-inf"))
        p = torch.softmax(t, -1)
        if params.top_p < 1.0:
            order = p.argsort(descending=True)
            keep = torch.cumsum(p[order], 0) - p[order] < params.top_p
            mask = torch.zeros(vocab, dtype=torch.bool)
            mask[order[keep]] = True
            p = torch.where(mask, p, 0.0)
            p = p / p.sum()
        target.append(p.double().numpy())
    first = np.bincount([e[0] for e in emitted], minlength=vocab)
    assert _chi2_ok(first, target[0]), (first / first.sum(), target[0])
    # Given the first proposal was kept, the second token follows position 1's distribution, and so on.
    second = np.bincount([e[1] for e in emitted if len(e) > 1], minlength=vocab)
    assert second.sum() == first[drafts[0]]
    assert _chi2_ok(second, target[1]), (second / second.sum(), target[1])
    third = np.bincount([e[2] for e in emitted if len(e) > 2], minlength=vocab)
    assert third.sum() == second[drafts[1]]
    assert _chi2_ok(third, target[2]), (third / third.sum(), target[2])


def test_accepting_every_proposal_would_be_caught():
    """The check above has teeth: emitting the draft whenever it is possible is not the target."""
    probs = np.array([0.4, 0.3, 0.2, 0.1, 0, 0, 0, 0])
    always_draft = np.array([0, 60_000, 0, 0, 0, 0, 0, 0])
    assert not _chi2_ok(always_draft, probs)


def test_lookup_takes_the_longest_suffix_and_its_latest_occurrence():
    t = np.array([5, 1, 2, 3, 9, 9, 1, 2, 3, 7, 8, 0, 2, 3])
    # Suffix [2, 3]: longest match of up to 4 tokens is 2 long ([1,2,3] is not a suffix); latest at 7..8.
    assert lookup(t, 2, 4, 3) == [7, 8, 0]
    t2 = np.array([1, 2, 3, 4, 1, 2, 3, 5, 6, 2, 3, 4, 0, 1, 2, 3])
    # [1,2,3] ends at 2 (then 4) and at 6 (then 5): the 4-token suffix [0,1,2,3] never occurred, so
    # 3 tokens; the latest occurrence (6) wins.
    assert lookup(t2, 2, 4, 2) == [5, 6]
    assert lookup(t2, 4, 4, 2) == []
    assert lookup(np.array([1, 2, 3, 4]), 1, 3, 4) == []
    assert lookup(np.array([4, 4, 4]), 1, 2, 5) == [4]  # runs off the end: what exists
    assert lookup(np.array([1, 2, 1, 2]), 2, 2, 0) == []


def test_proposer_keeps_each_history_in_step_with_the_request():
    class R:
        def __init__(self, rid, toks):
            self.request_id, self.all_token_ids = rid, toks

    prop = NgramProposer(k=3, min_n=2, max_n=3)
    r = R("a", [1, 2, 3, 4, 1, 2])
    assert prop.propose([r], [3]) == [[3, 4, 1]]
    r.all_token_ids += [3, 4]  # tokens appended: the mirror grows without a rebuild
    assert prop.propose([r], [2]) == [[1, 2]]
    r.all_token_ids += list(range(100, 300)) + [3, 4]
    assert prop.propose([r], [3]) == [[100, 101, 102]]
    prop.finished("a")
    assert "a" not in prop._history
