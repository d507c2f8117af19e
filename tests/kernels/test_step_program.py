"""The step program (inferq_kernels/cpu/step_program.c, gpuworker/models/cpu_step_program.py):
kernel calls encoded once and run by one foreign call give what the same calls made from
Python give; per-step arguments are read at each run; a kernel's refusal comes back with the
op that refused; calls of an unknown shape are not taken."""
from __future__ import annotations

import ctypes

import pytest
import torch

from inferq.gpuworker.attention import cpu_kernels
from inferq.gpuworker.models import cpu_step_program
from tests import quant_kernels

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


@pytest.mark.parametrize("runner", ["program", "python"])
def test_a_refusing_kernel_stops_the_run_at_its_op(runner):
    kern = cpu_kernels.load()
    silu = kern.silu_mul[torch.float32]
    x, y = torch.randn(1, 32), torch.zeros(1, 16)
    silu_out = torch.zeros(1, 16)
    # 3 query heads over 2 KV heads: the decode kernel refuses before reading any pointer
    refused = (kern.fns["paged_decode_f32"], (0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 3, 2, 64, 16, 1.0, 0))
    ops = [(silu, (x.data_ptr(), 32, 16, silu_out.data_ptr(), 1)), refused,
           (silu, (x.data_ptr(), 32, 16, y.data_ptr(), 1))]
    steps = (cpu_step_program.StepProgram.build(cpu_step_program.load(), ops, 1) if runner == "program"
             else cpu_step_program.PythonSteps(ops, 1))
    rc, at = steps.run()
    assert rc != 0 and at == 1
    assert not torch.equal(silu_out, torch.zeros(1, 16)), "the op before ran"
    assert torch.equal(y, torch.zeros(1, 16)), "the op after did not"


def test_calls_of_unknown_shape_are_not_taken():
    kern = cpu_kernels.load()
    prog = _program()
    assert not prog.add(lambda: 0, ())
    assert not prog.add(kern.lib.kernel_threads, (1,))  # (int) -> int: no such prototype in step_program.c
    assert len(prog) == 0
    with pytest.raises(TypeError):
        prog.add(kern.silu_mul[torch.float32], (0, 1, 2))


@pytest.mark.parametrize("runner", ["program", "python"])
def test_kv_store_puts_each_row_in_its_slot(runner):
    rows, width = 3, 8
    k, v = torch.randn(rows, width), torch.randn(rows, 2 * width)  # v's rows in a wider buffer, as in qkv
    key_cache, value_cache = torch.zeros(10, width), torch.zeros(10, width)
    slots = torch.tensor([7, 2, 5], dtype=torch.int64)
    row_bytes = width * 4
    ops = [(cpu_step_program.kv_store, (key_cache.data_ptr(), value_cache.data_ptr(), k.data_ptr(), row_bytes,
                                        v.data_ptr() + width * 4, 2 * width * 4, row_bytes, rows, slots.data_ptr()))]
    steps = (cpu_step_program.StepProgram.build(cpu_step_program.load(), ops, 1) if runner == "program"
             else cpu_step_program.PythonSteps(ops, 1))
    assert steps.run() == (0, -1)
    assert torch.equal(key_cache[slots], k) and torch.equal(value_cache[slots], v[:, width:])
    others = [i for i in range(10) if i not in slots.tolist()]
    assert torch.equal(key_cache[others], torch.zeros(len(others), width))


@pytest.mark.parametrize("runner", ["program", "python"])
def test_gather_copies_the_rows_named_at_each_run_and_refuses_an_index_outside_the_table(runner):
    table = torch.randn(6, 5)
    out = torch.zeros(3, 5)
    row_bytes = 5 * 4
    ops = [(cpu_step_program.gather, (out.data_ptr(), table.data_ptr(), row_bytes, cpu_step_program.PerStep(0), 3, 6))]
    steps = (cpu_step_program.StepProgram.build(cpu_step_program.load(), ops, 1) if runner == "program"
             else cpu_step_program.PythonSteps(ops, 1))
    for picked in ([4, 0, 4], [5, 1, 2]):
        idx = torch.tensor(picked, dtype=torch.int64)
        steps.params[0] = idx.data_ptr()
        assert steps.run() == (0, -1)
        assert torch.equal(out, table[idx])
    before = out.clone()
    for bad in ([1, 6, 0], [-1, 0, 0]):
        idx = torch.tensor(bad, dtype=torch.int64)
        steps.params[0] = idx.data_ptr()
        assert steps.run() == (-1, 0)
        assert torch.equal(out, before)  # nothing copied


@pytest.mark.parametrize("runner", ["program", "python"])
def test_quantized_rows_run_as_an_op_with_the_ids_read_at_each_run(runner):
    from inferq.gpuworker.models import quant_linear as ql
    from inferq.kernels.cpu import quant_reference as ref
    from tests.kernels.test_gguf_quant import random_packed

    lib = quant_kernels.require()
    packed = random_packed("Q4_1", 40, 64, seed=1)
    weight = ql.QuantLinear(lib, [ql.QuantWeight(packed, ref.SUPPORTED["Q4_1"], 64)], torch.float32).segments[0]
    out = torch.zeros(2, 64)
    ops = [weight.rows_call(lib, cpu_step_program.PerStep(0), 2, out.data_ptr(), False)]
    steps = (cpu_step_program.StepProgram.build(cpu_step_program.load(), ops, 1) if runner == "program"
             else cpu_step_program.PythonSteps(ops, 1))
    assert steps is not None
    for picked in ([3, 39], [0, 3]):
        ids = torch.tensor(picked, dtype=torch.int64)
        steps.params[0] = ids.data_ptr()
        assert steps.run() == (0, -1)
        assert torch.equal(out, ref.quant_rows(packed, ref.SUPPORTED["Q4_1"], 64, ids))
    ids = torch.tensor([0, 40], dtype=torch.int64)  # past the table: refused (-2), nothing written
    steps.params[0] = ids.data_ptr()
    before = out.clone()
    assert steps.run() == (-2, 0) and torch.equal(out, before)


def test_python_steps_make_the_same_calls_with_the_same_per_step_arguments():
    kern = cpu_kernels.load()
    silu = kern.silu_mul[torch.float32]
    a, b = torch.randn(2, 64), torch.randn(2, 64)
    outs = {name: torch.empty(2, 32) for name in ("program", "python")}
    ops = {name: [(silu, (cpu_step_program.PerStep(0), 64, 32, out.data_ptr(), 2))] for name, out in outs.items()}
    runners = {"program": cpu_step_program.StepProgram.build(cpu_step_program.load(), ops["program"], 1),
               "python": cpu_step_program.PythonSteps(ops["python"], 1)}
    for src in (a, b):
        for name, steps in runners.items():
            steps.params[0] = src.data_ptr()
            assert steps.run() == (0, -1)
        assert torch.equal(outs["program"], outs["python"])
        assert not torch.equal(outs["python"], torch.zeros(2, 32))


def test_a_program_is_not_built_where_an_op_has_no_shape():
    kern = cpu_kernels.load()
    ops = [(kern.silu_mul[torch.float32], (0, 64, 32, 0, 2)), (lambda: 0, ())]
    assert cpu_step_program.StepProgram.build(cpu_step_program.load(), ops, 1) is None
    assert cpu_step_program.StepProgram.build(None, ops[:1], 1) is None


def test_the_op_layout_matches_the_c_struct():
    assert cpu_step_program.load().step_op_bytes() == ctypes.sizeof(cpu_step_program.StepOp)
