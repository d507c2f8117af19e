"""scripts/gpu_check.py passes its dry run here, so its first call on a lent GPU machine does not
fail on something a CPU could have caught (docs/gpu-check.md).

The dry run executes every stage that needs no GPU: the compiler check, the import root, the
imports of each section and the pytest collection of exactly the GPU selection (with the
packages the GPU image lacks made unimportable), the budget arithmetic, the output folder.
"""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def load_gpu_check():
    # by path: scripts/ is a namespace package, not something to import by name in a test
    spec = importlib.util.spec_from_file_location("gpu_check_under_test", REPO / "scripts" / "gpu_check.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


gpu_check = load_gpu_check()


def test_dry_run_passes_every_stage_and_writes_only_under_out(tmp_path):
    out = tmp_path / "out"
    env = {k: v for k, v in os.environ.items() if k not in ("OUT", "PYTEST_ADDOPTS")}
    proc = subprocess.run(
        [sys.executable, "-m", "scripts.gpu_check", "--dry-run", "--out", str(out)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=240,
    )
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
    report = json.loads((out / "gpu_check.json").read_text())
    assert report["mode"] == "dry-run" and report["ok"] is True
    stages = {s["name"]: s for s in report["stages"]}
    assert [s["name"] for s in report["stages"]] == list(gpu_check.STAGES)
    assert not [s for s in report["stages"] if s["status"] in ("FAIL", "ERROR", "TIMEOUT")], report["stages"]
    assert stages["compiler"]["status"] == "PASS"
    assert stages["pytest-collect"]["status"] == "PASS", stages["pytest-collect"]
    assert "no collection error" in stages["pytest-collect"]["detail"]
    for name in gpu_check.GPU_SECTIONS:
        assert stages[name]["status"] == "SKIPPED" and "dry run" in stages[name]["detail"]
    # the collection ran with pydantic hidden, as on the GPU image (unless wheels are carried here)
    hidden = report["pytest_selection"]["hidden_in_dry_run"]
    assert "pydantic" in hidden or (REPO / ".gpu_carry" / "whl").is_dir()
    assert "--collect-only" not in report["pytest_selection"]["args"]
    # the bandwidth table and the floors derived from it
    table = report["device"]["bandwidth_table_Bps"]
    assert table["H100"] == 3.35e12 and table["H200"] == 4.8e12
    assert round(report["device"]["step_floor_us_by_device"]["H200"]["1"]) == 61
    assert report["budget"]["fits_with_rerun"] is True
    # everything under --out, nothing new in the repository root
    assert (out / "gpu_check.log").is_file() and (out / "pytest_collect.log").is_file()
    for name in ("gpu_check.json", "gpu_check.log", "pytest_collect.log", "pytest_kernels.xml"):
        assert not (REPO / name).exists(), name


@pytest.mark.parametrize("name, key, bandwidth", [
    ("NVIDIA H100 80GB HBM3", "H100", 3.35e12),
    ("NVIDIA H200", "H200", 4.8e12),
    ("NVIDIA H200 NVL", "H200", 4.8e12),
    ("NVIDIA H100 PCIe", "H100 PCIe", 2.0e12),
    ("NVIDIA H100 NVL", "H100 NVL", 3.9e12),
    ("NVIDIA A100-SXM4-80GB", None, None),
    ("", None, None),
    (None, None, None),
])
def test_bandwidth_by_device_name(name, key, bandwidth):
    assert gpu_check.bandwidth_for(name) == (key, bandwidth)


def test_step_floors_come_from_bytes_moved():
    # REFERENCES.md's whole-step floors at 4.8 TB/s (weights + KV at 1k context): 61 / 371 / 1310 µs
    floors = gpu_check.step_floors_us(4.8e12)
    for batch, documented in {1: 61, 64: 371, 256: 1310}.items():
        assert floors[batch] == pytest.approx(documented, rel=0.01)
    # SmolLM2-135M: 134.5 M parameters
    assert gpu_check.smollm2_parameters() == pytest.approx(134.5e6, rel=0.001)
    h100 = gpu_check.step_floors_us(3.35e12)
    assert h100[64] == pytest.approx(floors[64] * 4.8 / 3.35)


def test_default_budget_leaves_room_for_a_rerun():
    plan = gpu_check.plan_budget(gpu_check.DEFAULT_BUDGET_S)
    assert plan["fits_with_rerun"] and not plan["sections_below_minimum"]
    assert 2 * (gpu_check.START_ALLOWANCE_S + plan["recommended_timeout_s"]) <= 15 * 60
    assert plan["recommended_timeout_s"] <= 600  # the device tool's limit per command
    assert not gpu_check.plan_budget(450)["fits_with_rerun"]


def test_missing_compiler_is_reported_clearly():
    result = gpu_check.check_compiler(env={"PATH": ""})
    assert result["ok"] is False
    assert "no C compiler" in result["message"] and "gcc" in result["message"]


def test_plain_cc_is_not_enough_for_triton():
    def which(name, path=None):
        return "/usr/bin/cc" if name == "cc" else None

    result = gpu_check.check_compiler(env={"PATH": "/usr/bin"}, which=which)
    assert result["ok"] is False and "export CC=/usr/bin/cc" in result["message"]


def test_a_bad_CC_is_reported():
    result = gpu_check.check_compiler(env={"PATH": "", "CC": "no-such-compiler"})
    assert result["ok"] is False and "CC='no-such-compiler'" in result["message"]


def test_missing_python_headers_are_reported(tmp_path):
    def which(name, path=None):
        return "/usr/bin/gcc" if name == "gcc" else None

    result = gpu_check.check_compiler(env={"PATH": "/usr/bin"}, include_dir=str(tmp_path), which=which, probe=False)
    assert result["ok"] is False and "Python.h" in result["message"] and "-dev" in result["message"]


def test_collection_errors_are_attributed_to_the_missing_package():
    assert gpu_check.missing_module("E   ModuleNotFoundError: No module named 'pydantic'") == "pydantic"
    assert gpu_check.missing_module("ModuleNotFoundError: import of pydantic_core halted; None in sys.modules") \
        == "pydantic_core"
    assert gpu_check.missing_module("E   ModuleNotFoundError: No module named 'inferq.kernels'") == "inferq"
    assert gpu_check.missing_module("SyntaxError: invalid syntax") is None


def test_the_gpu_selection_leaves_out_this_file_and_the_cpu_only_tests():
    args = gpu_check.gpu_test_args(["tests/kernels/test_engine_triton.py"])
    assert "tests/kernels" in args and "--ignore=tests/kernels/test_gpu_check_dry_run.py" in args
    assert "--ignore=tests/kernels/test_engine_triton.py" in args
