"""`inferq bench offline --step` (per-step host time) and the vLLM peer's wiring.

No timing is asserted: only that the split is reported and a greedy decode step
makes exactly one blocking device->host transfer."""
from __future__ import annotations

import json

import pytest

from inferq.cli import main as inferq


def test_bench_step_reports_split_and_one_sync(tiny_model_folder, tmp_path, capsys):
    out = tmp_path / "step.json"
    rc = inferq(["bench", "offline", "--step", "--model", str(tiny_model_folder), "--batch-sizes", "1,4",
                 "--prompt-len", "20", "--steps", "3", "--json", str(out)])
    assert rc == 0
    printed = capsys.readouterr().out
    assert "| batch | schedule ms | prepare ms | forward ms | sample ms |" in printed
    doc = json.loads(out.read_text())
    assert [r["batch"] for r in doc["results"]] == [1, 4]
    for r in doc["results"]:
        assert r["syncs_per_step"] == 1
        assert all(r[k] >= 0 for k in ("schedule_ms", "prepare_ms", "forward_ms", "sample_ms", "output_ms"))


def test_vllm_peer_needs_its_python(monkeypatch, tmp_path):
    from inferq.bench.vllm_peer import ENV_PYTHON, vllm_python

    monkeypatch.delenv(ENV_PYTHON, raising=False)
    with pytest.raises(SystemExit, match="setup_vllm_peer.sh"):
        vllm_python(None)
    with pytest.raises(SystemExit, match="does not exist"):
        vllm_python(str(tmp_path / "nope" / "python"))
    monkeypatch.setenv(ENV_PYTHON, "/bin/sh")
    assert vllm_python(None) == "/bin/sh"


def test_vllm_peer_script_imports_no_inferq():
    """The child half runs in vLLM's venv: only the stdlib at module level."""
    import ast
    from pathlib import Path

    import inferq.bench.vllm_peer as peer

    tree = ast.parse(Path(peer.__file__).read_text())
    top = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
    names = {a.name.split(".")[0] for n in top if isinstance(n, ast.Import) for a in n.names} | {
        (n.module or "").split(".")[0] for n in top if isinstance(n, ast.ImportFrom)}
    assert names <= {"__future__", "json", "os", "subprocess", "sys", "tempfile", "time"}, names


def test_bench_step_host_only_runs_its_stand_in_model(tmp_path, capsys):
    """``--host-only`` swaps the model for a stand-in with no decode replay: the runner's CPU
    decode steps take its forward and LM head (the replay's head path is only for models that
    have one)."""
    from inferq.gpuworker.models.loader import bundled_model_path

    out = tmp_path / "step.json"
    rc = inferq(["bench", "offline", "--step", "--host-only", "--model", str(bundled_model_path()),
                 "--batch-sizes", "1,2", "--prompt-len", "8", "--steps", "3", "--json", str(out)])
    assert rc == 0
    assert "HOST ONLY" in capsys.readouterr().out
    assert [r["batch"] for r in json.loads(out.read_text())["results"]] == [1, 2]
