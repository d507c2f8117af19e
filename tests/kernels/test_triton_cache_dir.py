"""Triton's compiled kernels go to a persistent folder, set before any kernel can compile.

Each case imports the kernels in a fresh interpreter (the variable is process-wide)
and asks Triton where it will cache what it compiles.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
WHERE_TRITON_CACHES = (
    "import inferq.kernels.unified_attention, inferq.kernels.reshape_and_cache, triton; "
    "print(triton.knobs.cache.dir)"
)


def triton_cache_dir(home: Path, **env: str) -> str:
    clean = {k: v for k, v in os.environ.items() if k not in ("TRITON_CACHE_DIR", "INFERQ_CACHE_DIR")}
    clean.update(HOME=str(home), PYTHONPATH=str(REPO), **env)
    result = subprocess.run([sys.executable, "-c", WHERE_TRITON_CACHES], cwd=REPO, env=clean,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout.strip().splitlines()[-1]


@pytest.mark.parametrize("env, expected", [
    ({}, "{home}/.cache/inferq/triton"),  # beside inferq's other caches, per user
    ({"INFERQ_CACHE_DIR": "{home}/volume"}, "{home}/volume/triton"),  # the one cache root a deployment mounts
    ({"TRITON_CACHE_DIR": "{home}/mine"}, "{home}/mine"),  # Triton's own variable wins
])
def test_triton_caches_kernels_in_a_persistent_folder(tmp_path, env, expected):
    env = {k: v.format(home=tmp_path) for k, v in env.items()}
    assert triton_cache_dir(tmp_path, **env) == expected.format(home=tmp_path)
