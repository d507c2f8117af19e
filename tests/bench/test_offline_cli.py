"""`inferq bench offline` reaches the lead's offline benchmark with its options."""
from __future__ import annotations

import json

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
