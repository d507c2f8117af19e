"""`inferq bench offline` reaches the lead's offline benchmark with its options."""
from __future__ import annotations

import json

import pytest

from inferq.cli import main as inferq


def test_bench_offline_dispatches(tiny_model_folder, tmp_path, capsys):
    out = tmp_path / "offline.json"
    rc = inferq(["bench", "offline", "--model", str(tiny_model_folder), "--num-requests", "3", "--min-input", "4",
                 "--max-input", "8", "--min-output", "2", "--max-output", "4", "--threads", "1", "--peers", "none",
                 "--json", str(out)])
    assert rc == 0
    printed = capsys.readouterr().out
    assert "| inferq |" in printed
    doc = json.loads(out.read_text())
    assert doc["results"][0]["system"] == "inferq" and doc["results"][0]["output_tokens"] >= 6


def test_bench_help_and_unknown(capsys):
    assert inferq(["bench"]) == 2
    assert "serve" in capsys.readouterr().out
    assert inferq(["bench", "nope"]) == 2
    assert "unknown command 'nope'" in capsys.readouterr().err


def test_bench_speculative_dispatches_and_reports_both_systems(capsys):
    rc = inferq(["bench", "speculative", "--batches", "1", "--num-requests", "2", "--max-tokens", "12",
                 "--repeats", "1", "--doc-lines", "2,3", "--random-prompt", "8,16"])
    assert rc == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| copy") or line.startswith("| random")]
    assert [r.split(" | ")[2] for r in rows] == ["inferq", "inferq + n-gram"] * 2
    copy_spec = rows[1].split(" | ")
    assert int(copy_spec[7]) > 0  # a copied document: something was proposed


def test_bench_roofline_models_a_step(tmp_path, capsys):
    from inferq.bench.roofline import SMOLLM2, Machine, step_cost, step_ms
    from inferq.bench.random_model_shapes import parameter_count

    assert 134e6 < parameter_count(SMOLLM2) < 136e6  # the bundled model's published size
    cost = step_cost(SMOLLM2, batch=1, context=512, dtype_bytes=4)
    assert cost["matmul_flops"] == 2 * cost["matmul_bytes"] // 4  # batch 1: 2 FLOPs per weight
    slow_memory = step_ms(cost, Machine("m", 1, gbs=1.0, gflops=1e6))
    assert slow_memory["matmul"][1] == "memory" and slow_memory["attn"][1] == "memory"
    big = step_ms(step_cost(SMOLLM2, batch=512, context=512, dtype_bytes=4), Machine("m", 1, gbs=1e3, gflops=1.0))
    assert big["matmul"][1] == "compute"
    from inferq.gpuworker.models import cpu_linear

    if cpu_linear.load() is None:
        pytest.skip("no C compiler here: nothing to measure the ceilings with")
    out = tmp_path / "roofline.json"
    rc = inferq(["bench", "roofline", "--threads", "1", "--batches", "1,64", "--server", "big:32:460",
                 "--json", str(out)])
    assert rc == 0
    doc = json.loads(out.read_text())
    assert [m["cores"] for m in doc["machines"]] == [1, 32]
    assert all(m["gbs"] > 0 and m["gflops"] > 0 for m in doc["machines"])
    assert "| big (projected) | 64 |" in capsys.readouterr().out
