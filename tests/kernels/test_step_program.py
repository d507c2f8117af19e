"""The step program (inferq_kernels/cpu/step_program.c, gpuworker/models/cpu_step_program.py):
kernel calls encoded once and run by one foreign call give what the same calls made from
Python give; per-step arguments are read at each run; a kernel's refusal comes back with the
op that refused; calls of an unknown shape are not taken."""
from __future__ import annotations

import ctypes

import pytest
import torch

from inferq.gpuworker.attention import cpu_kernels
from inferq.gpuworker.models import cpu_linear, cpu_step_program

pytestmark = pytest.mark.skipif(cpu_step_program.load() is None or cpu_kernels.load() is None,
                                reason="no C compiler here: the CPU kernels do not build")


def _program(n_params: int = 1) -> cpu_step_program.StepProgram:
    return cpu_step_program.StepProgram(cpu_step_program.load(), n_params)


def test_calls_give_what_the_same_calls_from_python_give():
    kern = cpu_kernels.load()
    torch.manual_seed(0)
    rows, h = 3, 64
    res, hid, w = torch.randn(rows, h), torch.randn(rows, h), torch.rand(h) + 0.5
    gu = torch.randn(rows, 2 * h)
    ptr = lambda t: t.data_ptr()  # noqa: E731

    def calls(res, hid, out, act):
        norm, silu = kern.add_rms_norm[torch.float32], kern.silu_mul[torch.float32]
        return [(norm, (ptr(res), ptr(hid), ptr(w), ptr(out), rows, h, 1e-5)),
                (silu, (ptr(gu), 2 * h, h, ptr(act), rows))]

    want_res, want_out, want_act = res.clone(), torch.empty(rows, h), torch.empty(rows, h)
    for fn, args in calls(want_res, hid, want_out, want_act):
        assert fn(*args) == 0
    got_res, got_out, got_act = res.clone(), torch.empty(rows, h), torch.empty(rows, h)
    prog = _program()
    assert all(prog.add(fn, args) for fn, args in calls(got_res, hid, got_out, got_act))
    prog.seal()
    assert prog.run() == (0, -1)
    assert torch.equal(got_res, want_res) and torch.equal(got_out, want_out) and torch.equal(got_act, want_act)
    assert not torch.equal(got_out, torch.zeros_like(got_out))


def test_per_step_arguments_are_read_at_each_run():
    kern = cpu_kernels.load()
    silu = kern.silu_mul[torch.float32]
    a, b = torch.randn(2, 64), torch.randn(2, 64)
    out = torch.empty(2, 32)
    prog = _program(1)
    assert prog.add(silu, (cpu_step_program.PerStep(0), 64, 32, out.data_ptr(), 2))
    prog.seal()
    for src in (a, b):
        prog.params[0] = src.data_ptr()
        assert prog.run() == (0, -1)
        want = torch.empty(2, 32)
        silu(src.data_ptr(), 64, 32, want.data_ptr(), 2)
        assert torch.equal(out, want)


def test_a_refusing_kernel_stops_the_program_at_its_op():
    lib = cpu_linear.load()
    if lib is None:
        pytest.skip("the float matmul kernels need AVX2 or AVX-512")
    kern = cpu_kernels.load()
    x, y = torch.randn(1, 32), torch.zeros(1, 32)
    silu_out = torch.zeros(1, 16)
    prog = _program()
    assert prog.add(kern.silu_mul[torch.float32], (x.data_ptr(), 32, 16, silu_out.data_ptr(), 1))
    # n = 33 columns: not a whole number of panels, which every matmul kernel refuses
    assert prog.add(lib.f32_linear, (x.data_ptr(), 32, 1, x.data_ptr(), 33, 32, None, y.data_ptr(), 33))
    assert prog.add(kern.silu_mul[torch.float32], (x.data_ptr(), 32, 16, y.data_ptr(), 1))
    prog.seal()
    rc, at = prog.run()
    assert rc != 0 and at == 1
    assert not torch.equal(silu_out, torch.zeros(1, 16)), "the op before ran"
    assert torch.equal(y, torch.zeros(1, 32)), "the op after did not"


def test_calls_of_unknown_shape_are_not_taken():
    kern = cpu_kernels.load()
    prog = _program()
    assert not prog.add(lambda: 0, ())
    assert not prog.add(kern.lib.kernel_threads, (1,))  # (int) -> int: no such prototype in step_program.c
    assert len(prog) == 0
    with pytest.raises(TypeError):
        prog.add(kern.silu_mul[torch.float32], (0, 1, 2))


def test_kv_store_puts_each_row_in_its_slot():
    rows, width = 3, 8
    k, v = torch.randn(rows, width), torch.randn(rows, 2 * width)  # v's rows in a wider buffer, as in qkv
    key_cache, value_cache = torch.zeros(10, width), torch.zeros(10, width)
    slots = torch.tensor([7, 2, 5], dtype=torch.int64)
    prog = _program()
    row_bytes = width * 4
    prog.add_kv_store(key_cache.data_ptr(), value_cache.data_ptr(), k.data_ptr(), row_bytes,
                      v.data_ptr() + width * 4, 2 * width * 4, row_bytes, rows, slots.data_ptr())
    prog.seal()
    assert prog.run() == (0, -1)
    assert torch.equal(key_cache[slots], k) and torch.equal(value_cache[slots], v[:, width:])
    others = [i for i in range(10) if i not in slots.tolist()]
    assert torch.equal(key_cache[others], torch.zeros(len(others), width))


def test_the_op_layout_matches_the_c_struct():
    assert cpu_step_program.load().step_op_bytes() == ctypes.sizeof(cpu_step_program.StepOp)
