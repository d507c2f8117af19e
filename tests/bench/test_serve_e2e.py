"""`inferq bench serve` against a real worker: through Redis (producer SDK) and
through the gateway (HTTP). Asserts what the run must contain, never timings."""
from __future__ import annotations

import json

import pytest

from inferq.bench.cli import main as bench_main
from inferq.bench.datasets import random_dataset
from tests.gateway.stack import running_gateway

N, IN_LEN, OUT_LEN = 6, 24, 6
COMMON = ["--num-prompts", str(N), "--random-input-len", str(IN_LEN), "--random-output-len", str(OUT_LEN),
          "--random-range-ratio", "0.5", "--request-rate", "50", "--burstiness", "0.5", "--max-concurrency", "4",
          "--num-warmups", "1", "--percentiles", "90,99", "--goodput", "ttft:60000", "tpot:60000", "--no-progress",
          "--seed", "3"]


def check_result(path, expected_outputs: int):
    doc = json.loads(path.read_text())
    s = doc["summary"]
    assert (s["completed"], s["failed"]) == (N, 0)
    # EOS is ignored: every request makes exactly its requested tokens.
    assert s["total_output_tokens"] == expected_outputs
    assert s["good_requests"] == N  # the SLOs are a minute: nothing can miss them
    for key in ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms"):
        assert set(s[key]) >= {"mean", "median", "p90", "p99"}
    assert 0 < s["ttft_ms"]["median"] <= s["e2e_ms"]["median"]
    reqs = doc["requests"]
    assert len(reqs) == N
    for r in reqs:
        assert r["success"] and r["output_tokens"] >= 3
        times = r["chunk_times"]
        assert times == sorted(times) and times[0] > r["sent_at"] >= 0
        assert len(times) >= 2  # a streamed reply arrives in several chunks
    return doc


def expected_output_tokens():
    return sum(r.output_len for r in random_dataset(N, IN_LEN, OUT_LEN, 0.5, 49152, 3))


def test_bench_serve_through_redis(bench_stack, tiny_model_name, tmp_path, capsys):
    out = tmp_path / "serve.json"
    rc = bench_main(["serve", "--backend", "redis", "--redis-url", bench_stack.url, "--model", tiny_model_name,
                     "--result-file", str(out), *COMMON])
    printed = capsys.readouterr().out
    assert rc == 0, printed
    assert "Serving benchmark result" in printed and "Request goodput" in printed
    doc = check_result(out, expected_output_tokens())
    assert doc["config"]["backend"] == "redis" and doc["config"]["model"] == tiny_model_name
    png = out.with_suffix(".png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bench_serve_through_the_gateway(bench_stack, tiny_model_name, tmp_path, capsys):
    out = tmp_path / "serve-http.json"
    with running_gateway(bench_stack.url) as url:
        rc = bench_main(["serve", "--backend", "http", "--base-url", url, "--model", tiny_model_name,
                         "--result-file", str(out), "--figure", str(tmp_path / "fig.png"), *COMMON])
    assert rc == 0, capsys.readouterr()
    check_result(out, expected_output_tokens())
    assert (tmp_path / "fig.png").stat().st_size > 1000


def test_bench_serve_without_a_worker_says_so(bench_stack, tmp_path, capsys):
    rc = bench_main(["serve", "--redis-url", bench_stack.url, "--model", "nobody-serves-this",
                     "--result-file", str(tmp_path / "x.json"), *COMMON])
    assert rc == 1
    assert "no live worker serves model 'nobody-serves-this'" in capsys.readouterr().err.replace("\n", " ")
    assert not (tmp_path / "x.json").exists()


@pytest.mark.parametrize("args, msg", [(["--goodput", "itl:5"], "goodput SLO"),
                                       (["--dataset", "jsonl"], "--dataset-path"),
                                       (["--percentiles", "120"], "percentiles")])
def test_bench_serve_bad_options(args, msg, capsys):
    rc = bench_main(["serve", "--no-progress", *args])
    assert rc == 1
    assert msg in capsys.readouterr().err
