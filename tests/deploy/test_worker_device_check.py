"""The worker's start-up device check (gpuworker/service/device_check.py): an explicit CUDA
device that is not usable, or CUDA without what Triton builds with, is refused with the
reason before the model loads; only an unset device falls back to the CPU."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from inferq.gpuworker.service.device_check import CudaFacts, DeviceUnusable, check_device, missing_build_tools

ROOT = Path(__file__).resolve().parents[2]
CPU_ONLY = CudaFacts(built_for=None, available=False, count=0)
NO_GPU = CudaFacts(built_for="12.6", available=False, count=0)
ONE_GPU = CudaFacts(built_for="12.6", available=True, count=1)


@pytest.fixture
def toolchain(tmp_path) -> tuple[dict, str]:
    """(env with a gcc on PATH, a folder with Python.h): everything Triton needs."""
    bin_dir, include = tmp_path / "bin", tmp_path / "include"
    bin_dir.mkdir()
    include.mkdir()
    (bin_dir / "gcc").write_text("#!/bin/sh\n")
    (bin_dir / "gcc").chmod(0o755)
    (include / "Python.h").write_text("")
    return {"PATH": str(bin_dir)}, str(include)


@pytest.mark.parametrize("requested, cuda, says", [
    ("cuda", CPU_ONLY, "CPU-only build"),
    ("cuda", NO_GPU, "sees no usable GPU"),
    ("cuda:0", NO_GPU, "sees no usable GPU"),
    ("cuda:1", ONE_GPU, "only 1 GPU(s) are visible"),
])
def test_an_explicit_cuda_device_that_is_not_usable_is_refused(requested, cuda, says, toolchain):
    env, include = toolchain
    with pytest.raises(DeviceUnusable) as e:
        check_device(requested, None, cuda, env, include)
    assert says in str(e.value) and f"INFERQ_DEVICE={requested}" in str(e.value)
    assert "INFERQ_DEVICE=cpu" in str(e.value)  # how to run on the CPU on purpose


@pytest.mark.parametrize("requested", [None, "", "cpu"])
def test_an_unset_or_cpu_device_runs_on_the_cpu_without_asking_for_build_tools(requested, tmp_path):
    empty = {"PATH": str(tmp_path)}
    assert check_device(requested, None, NO_GPU, empty, str(tmp_path)) == "cpu"
    assert check_device(requested, None, CPU_ONLY, empty, str(tmp_path)) == "cpu"


def test_cuda_with_the_build_tools_passes(toolchain):
    env, include = toolchain
    assert check_device("cuda", None, ONE_GPU, env, include) == "cuda"
    assert check_device("cuda:0", "triton", ONE_GPU, env, include) == "cuda"
    assert check_device(None, None, ONE_GPU, env, include) == "cuda"  # auto-detected CUDA


def test_cuda_without_a_compiler_or_python_headers_names_both(tmp_path):
    empty = {"PATH": str(tmp_path)}
    for requested in ("cuda", None):
        with pytest.raises(DeviceUnusable) as e:
            check_device(requested, None, ONE_GPU, empty, str(tmp_path))
        message = str(e.value)
        assert "no C compiler" in message and "install gcc" in message
        assert f"no Python.h in {tmp_path}" in message
        assert f"python{sys.version_info.major}.{sys.version_info.minor}-dev" in message
    # The torch attention backend runs no Triton kernel: nothing to build.
    assert check_device("cuda", "torch", ONE_GPU, empty, str(tmp_path)) == "cuda"


def test_a_cc_that_is_not_there_is_named(toolchain):
    env, include = toolchain
    assert missing_build_tools(env, include) == []
    (problem,) = missing_build_tools({**env, "CC": "/nonexistent/cc"}, include)
    assert "$CC='/nonexistent/cc'" in problem


@pytest.mark.skipif(CudaFacts.from_torch().available, reason="this machine has a usable GPU")
def test_a_worker_told_to_use_cuda_without_a_gpu_exits_with_the_reason(tmp_path):
    """The real worker process: exit 2 and the reason, before Redis or the model (neither exists here)."""
    env = dict(os.environ, INFERQ_DEVICE="cuda", PYTHONPATH=str(ROOT))
    r = subprocess.run([sys.executable, "-m", "inferq.gpuworker.service", "--redis-url", "redis://127.0.0.1:1/0",
                        "--model", str(tmp_path / "no-model")], capture_output=True, text=True, timeout=120,
                       cwd=tmp_path, env=env)
    assert r.returncode == 2, r.stdout[-2000:] + r.stderr[-2000:]
    assert "INFERQ_DEVICE=cuda but CUDA is not usable" in r.stderr
