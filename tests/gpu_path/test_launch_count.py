"""The launch counts docs/kernels.md gives for a mixed step ("CUDA graphs"), kept
true: per layer two Triton launches (cache write, attention) and 32 aten ops that
launch a kernel, plus a fixed 16 per step (the greedy argmax one of them, as on
CUDA); a mixed step launches what a decode-only step does, apart from gathering its
sampling rows. Counted as in
tests/gpu_path/launch_count.py (Triton interpreted, the model's plain torch ops)."""
from __future__ import annotations

from tests.gpu_path.launch_count import count_steps


def total(counts: dict, key: str) -> int:
    return sum(counts[key].values())


def test_a_mixed_step_launches_two_triton_kernels_and_32_aten_kernels_per_layer(tmp_path):
    two, four = count_steps(2, str(tmp_path / "two")), count_steps(4, str(tmp_path / "four"))
    per_layer = {key: (total(four["mixed"], key) - total(two["mixed"], key)) // 2 for key in ("triton", "launching")}
    assert per_layer == {"triton": 2, "launching": 32}
    assert total(two["mixed"], "launching") - 2 * per_layer["launching"] == 16
    assert two["mixed"]["tokens"] > two["mixed"]["seqs"] > 1  # decodes next to a prefill chunk
    assert total(two["mixed"], "launching") - total(two["decode"], "launching") == 2  # index_select of the rows
