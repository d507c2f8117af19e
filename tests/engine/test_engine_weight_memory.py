"""One copy of the weights: an engine on the bundled model whose matmul weights are prepacked
for the CPU holds no more memory than one that keeps them plain (prepacking replaces the plain
tensors rather than adding a copy). Each engine is built in a fresh process and measured by its
VmRSS (`inferq bench weight-memory`), so nothing another test loaded is counted."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from inferq.gpuworker.attention import cpu_kernels


def _measure(*args: str) -> dict:
    done = subprocess.run([sys.executable, "-m", "inferq.bench.weight_memory", "--kv-mb", "32", *args],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_prepacked_engine_holds_one_copy_of_the_weights(dtype):
    if dtype == "bfloat16" and not cpu_kernels.cpu_has("avx512_bf16") and not cpu_kernels.cpu_has("amx_bf16"):
        pytest.skip("no bf16 matmul kernel on this CPU (bf16 prepacking is oneDNN's, covered in tests/models)")
    packed, plain = _measure("--dtype", dtype), _measure("--dtype", dtype, "--no-prepack")
    assert plain["packing"] is None
    if packed["packing"] is None:
        pytest.skip("no matmul kernels here (no C compiler or AVX2): nothing is prepacked")
    one_copy = packed["one_copy_mb"]
    # The model's own tensors (parameters and buffers: the packed panels are buffers).
    assert packed["model_tensors_mb"] <= 1.1 * one_copy, packed
    # The process: the plain engine holds one copy of the weights (plus the KV cache, tokenizer,
    # torch); the prepacked one at most a tenth of a copy more. Before this change it held
    # two copies (fp32 on a Zen 5: 1,454 MB over the imports against 707 MB).
    assert packed["rss_delta_mb"] <= plain["rss_delta_mb"] + 0.1 * one_copy, (packed, plain)
