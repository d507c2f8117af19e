"""The compiled path builds: every kernel compiles to an sm_90 (H100/H200) cubin on this CPU machine.

The interpreter runs the kernels' Python, not Triton's compiler, so a kernel
can pass every interpreted test and still fail to compile for a GPU. Triton's
compiler and ptxas need no GPU, so `python -m inferq.kernels.compile_check` compiles
the variants the engine launches (same constexprs as a real launch, same
alignment specialisation) and reports registers and spills.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_kernels_compile_for_hopper_without_spilling_in_half_precision():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(REPO)
    env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    result = subprocess.run(
        [sys.executable, "-m", "inferq.kernels.compile_check", "--arch", "90"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=600,
    )
    report = result.stdout
    assert result.returncode == 0, report + result.stderr[-3000:]
    lines = [line for line in report.splitlines() if line.startswith(("ok", "FAIL"))]
    assert len(lines) >= 8 and all(line.startswith("ok") for line in lines), report
    assert "0 failure(s)" in report
    for line in lines:
        if "bfloat16" in line or "float16" in line:  # the engine's CUDA dtypes must not spill registers
            assert "SPILLS" not in line, line
