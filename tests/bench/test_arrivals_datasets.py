"""Arrival generators and datasets of `bench serve`."""
from __future__ import annotations

import json
import math
import statistics

import pytest

from inferq.bench.arrivals import arrival_offsets
from inferq.bench.datasets import jsonl_dataset, random_dataset, shared_prefix_dataset


def gaps(offsets):
    return [b - a for a, b in zip(offsets, offsets[1:])]


def test_poisson_gaps_have_mean_one_over_rate_and_cv_one():
    g = gaps(arrival_offsets(20001, rate=4.0, burstiness=1.0, seed=1))
    mean = statistics.fmean(g)
    assert mean == pytest.approx(0.25, rel=0.03)
    # exponential: standard deviation equals the mean
    assert statistics.pstdev(g) / mean == pytest.approx(1.0, rel=0.05)


@pytest.mark.parametrize("burstiness", [0.25, 4.0])
def test_gamma_burstiness_keeps_the_rate_and_changes_the_spread(burstiness):
    g = gaps(arrival_offsets(20001, rate=2.0, burstiness=burstiness, seed=2))
    mean = statistics.fmean(g)
    assert mean == pytest.approx(0.5, rel=0.05)
    # gamma with shape k: coefficient of variation 1/sqrt(k)
    assert statistics.pstdev(g) / mean == pytest.approx(1 / math.sqrt(burstiness), rel=0.07)


def test_arrivals_start_at_zero_are_sorted_and_reproducible():
    a = arrival_offsets(50, 10.0, seed=3)
    assert a[0] == 0.0 and a == sorted(a) and a == arrival_offsets(50, 10.0, seed=3)
    assert a != arrival_offsets(50, 10.0, seed=4)
    assert arrival_offsets(5, math.inf) == [0.0] * 5


@pytest.mark.parametrize("kw", [dict(rate=0), dict(rate=-1), dict(rate=1, burstiness=0)])
def test_arrivals_reject_bad_parameters(kw):
    with pytest.raises(ValueError):
        arrival_offsets(3, **kw)


def test_random_dataset_lengths_within_range():
    reqs = random_dataset(200, input_len=100, output_len=20, range_ratio=0.5, vocab_size=5000, seed=0)
    ins = [len(r.prompt) for r in reqs]
    outs = [r.output_len for r in reqs]
    assert min(ins) >= 50 and max(ins) <= 150 and len(set(ins)) > 20
    assert min(outs) >= 10 and max(outs) <= 30
    assert all(r.prompt_len == len(r.prompt) for r in reqs)
    assert all(1000 <= t < 5000 for r in reqs for t in r.prompt)
    fixed = random_dataset(5, 32, 8, 0.0)
    assert {len(r.prompt) for r in fixed} == {32} and {r.output_len for r in fixed} == {8}


def test_shared_prefix_dataset_shares_prefixes():
    reqs = shared_prefix_dataset(12, num_prefixes=3, prefix_len=40, suffix_len=5, output_len=7, seed=0)
    prefixes = {tuple(r.prompt[:40]) for r in reqs}
    assert len(prefixes) == 3
    assert all(len(r.prompt) == 45 and r.output_len == 7 for r in reqs)


def test_jsonl_dataset(tmp_path):
    f = tmp_path / "d.jsonl"
    f.write_text("\n".join([json.dumps({"prompt": "hello", "max_tokens": 5}),
                            "",
                            json.dumps({"prompt_token_ids": [5, 6, 7]}),
                            json.dumps({"prompt": "third", "output_len": 3})]))
    reqs = jsonl_dataset(f, default_output_len=9)
    assert [(r.prompt, r.output_len) for r in reqs] == [("hello", 5), ([5, 6, 7], 9), ("third", 3)]
    assert len(jsonl_dataset(f, n=2)) == 2


@pytest.mark.parametrize("line, msg", [("not json", "not JSON"), ("[1]", "JSON object"),
                                       ('{"prompt": ""}', "non-empty"), ('{"prompt": "x", "max_tokens": 0}', "positive")])
def test_jsonl_dataset_errors_name_the_line(tmp_path, line, msg):
    f = tmp_path / "bad.jsonl"
    f.write_text(line + "\n")
    with pytest.raises(ValueError, match=msg) as e:
        jsonl_dataset(f)
    assert "bad.jsonl:1" in str(e.value)
