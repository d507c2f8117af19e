"""The step program (inferq_kernels/cpu/step_program.c, gpuworker/models/cpu_step_program.py):
kernel calls encoded once and run by one foreign call give what the same calls made from
Python give; per-step arguments are read at each run; a kernel's refusal comes back with the
op that refused; calls of an unknown shape are not taken. At two threads a program whose
kernels all share their work runs as one team and gives the one-thread results."""
from __future__ import annotations

import ctypes

import pytest
import torch

from inferq.gpuworker.attention import cpu_kernels
from inferq.gpuworker.engine import cpu_argmax
from inferq.gpuworker.models import cpu_step_program
from inferq.kernels.cpu import loader
from tests import openmp_threads, quant_kernels

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


@pytest.mark.timeout(300, method="thread")  # a team left waiting hangs in C: fail, do not hang
@pytest.mark.parametrize("runner,threads", [("program", 1), ("program", 2), ("python", 1)])
def test_a_refusing_kernel_stops_the_run_at_its_op(runner, threads):
    if threads > 1:
        openmp_threads.require()
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
    with openmp_threads.threads(threads, kern.lib, cpu_step_program.load()):
        # many runs: in a team every thread must stop after the refusing op's meeting, even a
        # thread that reaches it after another has gone on (a hang here: one left waiting)
        for _ in range(200 if threads > 1 else 1):
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


def _team_calls(kern, qweight, bufs: dict) -> list:
    """A step's kinds of call on 5 rows: the residual add and norm (in place: a kernel run whole
    by each thread of a team would add twice), SiLU-and-mul, a quantized projection (its
    activation quantizer, then 96 columns of Q4_1 blocks in 6 groups), the argmax, and the K/V
    store and a row gather (ops with no kernel: thread 0's)."""
    ptr = lambda t: t.data_ptr()  # noqa: E731
    rows, h = 5, 64
    norm, silu = kern.add_rms_norm[torch.float32], kern.silu_mul[torch.float32]
    proj, xbufs = qweight.replay_calls(bufs["out"], bufs["y"])
    bufs["xbufs"] = xbufs
    return [(norm, (ptr(bufs["res"]), ptr(bufs["hid"]), ptr(bufs["w"]), ptr(bufs["out"]), rows, h, 1e-5)),
            (silu, (ptr(bufs["gu"]), 2 * h, h, ptr(bufs["act"]), rows)),
            *proj,
            (cpu_argmax.load().fns[torch.float32], (ptr(bufs["y"]), 96, rows, 96, ptr(bufs["picked"]))),
            (cpu_step_program.kv_store, (ptr(bufs["kc"]), ptr(bufs["vc"]), ptr(bufs["act"]), h * 4, ptr(bufs["out"]),
                                         h * 4, h * 4, rows, ptr(bufs["slots"]))),
            (cpu_step_program.gather, (ptr(bufs["gathered"]), ptr(bufs["kc"]), h * 4, ptr(bufs["slots"]), rows, 9))]


def _team_buffers() -> dict:
    torch.manual_seed(3)
    rows, h = 5, 64
    return {"res": torch.randn(rows, h), "hid": torch.randn(rows, h), "w": torch.rand(h) + 0.5,
            "out": torch.empty(rows, h), "gu": torch.randn(rows, 2 * h), "act": torch.empty(rows, h),
            "y": torch.empty(rows, 96), "picked": torch.zeros(rows, dtype=torch.int64),
            "kc": torch.zeros(9, h), "vc": torch.zeros(9, h), "slots": torch.tensor([8, 0, 3, 5, 1]),
            "gathered": torch.zeros(rows, h)}


def _quant_weight():
    from inferq.gpuworker.models import quant_linear as ql
    from inferq.kernels.cpu import quant_reference as ref
    from tests.kernels.test_gguf_quant import random_packed

    lib = quant_kernels.require()
    return lib, ql.QuantLinear(lib, [ql.QuantWeight(random_packed("Q4_1", 96, 64, seed=2), ref.SUPPORTED["Q4_1"], 64)],
                               torch.float32, activations="int8")


@openmp_threads.needed()
def test_a_team_program_gives_the_one_thread_results():
    """At two threads a program whose kernels are all listed in their files' team_kernels[] runs
    as one team (each kernel the calling thread's share, thread 0 the ops with no kernel, a
    barrier after each op): the same bits as the same calls made one by one at one thread."""
    kern = cpu_kernels.load()
    qlib, qweight = _quant_weight()
    libs = (kern.lib, qlib, cpu_argmax.load(), cpu_step_program.load())
    want, got = _team_buffers(), _team_buffers()
    steps = cpu_step_program.PythonSteps(_team_calls(kern, qweight, want), 1)
    prog = cpu_step_program.StepProgram.build(cpu_step_program.load(), _team_calls(kern, qweight, got), 1)
    assert prog is not None and prog.team, "every kernel here shares its work in a team"
    for _ in range(3):  # the in-place residual moves on at each run: both sides run alike
        with openmp_threads.threads(1, *libs):
            assert steps.run() == (0, -1)
        with openmp_threads.threads(2, *libs):
            assert prog.run() == (0, -1)
    for name in ("res", "out", "act", "y", "picked", "kc", "vc", "gathered"):
        assert torch.equal(got[name], want[name]), name
    assert not torch.equal(got["y"], torch.zeros_like(got["y"]))


@openmp_threads.needed()
def test_a_program_with_a_kernel_not_listed_for_teams_runs_op_by_op(monkeypatch):
    """A kernel missing from team_kernels[] (the AMX matmuls, whose threads set up their tiles in
    their own region) keeps the whole program op by op, each kernel opening its own region."""
    kern = cpu_kernels.load()
    qlib, qweight = _quant_weight()
    silu = ctypes.cast(kern.silu_mul[torch.float32], ctypes.c_void_p).value
    assert loader.shares_in_team(silu)
    monkeypatch.setattr(loader, "_team_kernels", loader._team_kernels - {silu})
    want, got = _team_buffers(), _team_buffers()
    with openmp_threads.threads(1, kern.lib, qlib, cpu_argmax.load()):
        assert cpu_step_program.PythonSteps(_team_calls(kern, qweight, want), 1).run() == (0, -1)
    prog = cpu_step_program.StepProgram.build(cpu_step_program.load(), _team_calls(kern, qweight, got), 1)
    assert prog is not None and not prog.team
    with openmp_threads.threads(2, kern.lib, qlib, cpu_argmax.load(), cpu_step_program.load()):
        assert prog.run() == (0, -1)
    for name in ("res", "out", "act", "y", "picked", "gathered"):
        assert torch.equal(got[name], want[name]), name


def test_the_op_layout_matches_the_c_struct():
    assert cpu_step_program.load().step_op_bytes() == ctypes.sizeof(cpu_step_program.StepOp)
