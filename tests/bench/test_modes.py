"""`inferq bench modes` on a tiny random Llama: structure and scheduling
sanity of each mode, never timing thresholds."""
from __future__ import annotations

import json

import pytest

from inferq.bench.mixed_workload import mixed_workload

SHORT, LONG, OUT, N, CHUNK, STATIC_B = (4, 12), (40, 60), (2, 6), 6, 16, 2


@pytest.fixture(scope="module")
def modes_run(tmp_path_factory, tiny_model_folder):
    from inferq.bench.cli import main as bench_main

    tmp = tmp_path_factory.mktemp("modes")
    folder = tiny_model_folder
    out, fig = tmp / "modes.json", tmp / "modes.png"
    # All requests arrive at once (rate inf): each mode's step plan is then deterministic.
    rc = bench_main(["modes", "--model", str(folder), "--num-requests", str(N), "--short-input", "%d,%d" % SHORT,
                     "--long-input", "%d,%d" % LONG, "--long-fraction", "0.34", "--output", "%d,%d" % OUT,
                     "--request-rate", "inf", "--chunk-budget", str(CHUNK), "--static-batch-size", str(STATIC_B),
                     "--max-num-seqs", "8", "--threads", "1", "--no-progress", "--json", str(out),
                     "--figure", str(fig)])
    assert rc == 0
    return json.loads(out.read_text()), fig


def test_every_mode_makes_every_token(modes_run):
    doc, _ = modes_run
    assert list(doc["results"]) == ["naive", "static", "continuous", "chunked"]
    expected = doc["workload"]["output_tokens"]
    assert doc["workload"]["long"] == 2
    for name, r in doc["results"].items():
        lat = r["latency"]
        assert lat["output_tokens"] == expected, name
        assert lat["throughput_tok_s"] > 0 and lat["mean_ttft_ms"] > 0
        assert lat["p99_itl_ms"] >= lat["median_itl_ms"] > 0


def test_modes_schedule_as_designed(modes_run):
    doc, _ = modes_run
    res = doc["results"]
    # NAIVE: one request at a time, so one step per output token.
    assert res["naive"]["kv"]["max_requests_holding_blocks"] == 1
    assert res["naive"]["latency"]["steps"] == doc["workload"]["output_tokens"]
    # STATIC: never more than one batch in the engine.
    assert res["static"]["kv"]["max_requests_holding_blocks"] <= STATIC_B
    # CONTINUOUS: whole prompts in one step; CHUNKED: never more than the budget per step.
    assert res["continuous"]["latency"]["max_step_tokens"] >= LONG[0]
    assert res["chunked"]["latency"]["max_step_tokens"] <= CHUNK
    assert res["chunked"]["spec"] == {"name": "chunked", "max_num_seqs": 8, "max_num_batched_tokens": CHUNK,
                                      "chunked": True, "static": False}
    # Batching modes run all requests together: fewer steps than one at a time.
    assert res["continuous"]["latency"]["steps"] < res["naive"]["latency"]["steps"]
    assert res["continuous"]["kv"]["max_requests_holding_blocks"] == N


def test_kv_waste_paged_vs_contiguous(modes_run):
    doc, _ = modes_run
    for name, r in doc["results"].items():
        kv = r["kv"]
        assert kv["samples"] > 0
        assert 0 <= kv["paged_waste"] < 1
        # Reserving max_model_len (512 for the tiny model) per request wastes far more.
        assert kv["contiguous_max_model_len_waste"] > kv["paged_waste"], name
        assert kv["contiguous_max_model_len_waste"] > kv["contiguous_final_len_waste"], name
        assert kv["max_model_len"] == 512


def test_figure_written(modes_run):
    _, fig = modes_run
    assert fig.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_mixed_workload_shape():
    wl = mixed_workload(40, short_input=(5, 9), long_input=(100, 120), long_fraction=0.25, output=(3, 7),
                        request_rate=4.0, vocab_size=3000, seed=1)
    lens = [len(r.prompt_token_ids) for r in wl]
    assert sum(n >= 100 for n in lens) == 10
    assert all(5 <= n <= 9 or 100 <= n <= 120 for n in lens)
    assert all(3 <= r.output_len <= 7 for r in wl)
    arrivals = [r.arrival_s for r in wl]
    assert arrivals[0] == 0 and arrivals == sorted(arrivals) and arrivals[-1] > 0
    assert len({r.request_id for r in wl}) == 40


@pytest.mark.parametrize("argv, msg", [(["--modes", "naive,turbo"], "unknown turbo"),
                                       (["--short-input", "9,3"], "MIN <= MAX"),
                                       (["--threads", "0"], "--threads")])
def test_modes_bad_options(argv, msg, capsys):
    from inferq.bench.modes import parse_args

    with pytest.raises(SystemExit):
        parse_args(argv)
    assert msg in capsys.readouterr().err


def test_step_cost_fit_recovers_a_line():
    from inferq.bench.modes import step_cost_fit

    res = {"a": {"latency": {"steps_tokens_ms": [[1, 110.0], [10, 200.0]]}},
           "b": {"latency": {"steps_tokens_ms": [[100, 1100.0], [40, 500.0]]}}}
    fit = step_cost_fit(res)
    assert fit["fixed_ms"] == pytest.approx(100.0) and fit["per_token_ms"] == pytest.approx(10.0)
    assert fit["steps"] == 4 and fit["median_small_step_ms"] == pytest.approx(155.0)


def test_kv_waste_arithmetic():
    from inferq.bench.modes import summarize_kv
    from inferq.bench.replay import KVSample, Trace

    # step 1: one request, 20 tokens in 2 blocks of 16; step 2: two requests, 50 tokens in 4 blocks
    samples = [KVSample(1, 20, 32, 40), KVSample(2, 50, 64, 100)]
    kv = summarize_kv(Trace({}, samples, 1.0, 2, [20, 2]), max_model_len=100)
    assert kv["paged_waste"] == pytest.approx(1 - 70 / 96)
    assert kv["contiguous_final_len_waste"] == pytest.approx(1 - 70 / 140)
    assert kv["contiguous_max_model_len_waste"] == pytest.approx(1 - 70 / 300)
    assert kv["max_requests_holding_blocks"] == 2


def test_step_cost_fit_with_sequences():
    from inferq.bench.modes import step_cost_fit

    # ms = 50 + 2 * tokens + 30 * seqs
    pts = [[t, 50 + 2 * t + 30 * q, q] for t, q in [(1, 1), (8, 8), (100, 1), (120, 4), (16, 16), (300, 2)]]
    fit = step_cost_fit({"m": {"latency": {"steps_tokens_ms": pts}}})["with_seqs"]
    assert fit["fixed_ms"] == pytest.approx(50) and fit["per_token_ms"] == pytest.approx(2)
    assert fit["per_seq_ms"] == pytest.approx(30)
