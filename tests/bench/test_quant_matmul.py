"""``inferq bench quant-matmul``: the int8 column timed through QuantLinear's call or through its
kernels' raw calls (``--calls kernel``, what the decode replay runs), the raw calls computing what
the module call computes. (No claim on speed: the figures are noisy here.)"""
from __future__ import annotations

import re

import torch

from inferq.bench import quant_matmul
from inferq.gpuworker.models import quant_linear as ql
from inferq.kernels.cpu import quant_reference as ref
from tests import quant_kernels

pytestmark = quant_kernels.needed()


def test_kernel_calls_compute_the_module_calls_result():
    lib = ql.load()
    n, k = 64, 256
    lin = ql.QuantLinear(lib, [ql.QuantWeight(quant_matmul.random_blocks("Q4_1", n, k, 0), ref.SUPPORTED["Q4_1"], k)],
                         torch.float32, "int8")
    x, y = torch.randn(3, k), torch.full((3, n), float("nan"))
    calls, _buffers = lin.replay_calls(x, y)
    for fn, args in calls:
        fn(*args)
    assert torch.equal(y, lin(x))


def test_both_call_modes_report_every_row(capsys):
    torch.set_num_threads(1)
    for calls in ("module", "kernel"):
        assert quant_matmul.main(["--types", "Q4_1,Q8_0", "--rows", "1,3", "--layers", "1", "--repeats", "1",
                                  "--calls", calls]) == 0
        out = capsys.readouterr().out
        rows = re.findall(r"^\| (Q4_1|Q8_0) \| (\d+) \| ([\d.]+) \(([\d.]+)\) \|", out, re.M)
        assert [(t, m) for t, m, *_ in rows] == [("Q4_1", "1"), ("Q4_1", "3"), ("Q8_0", "1"), ("Q8_0", "3")], out
        assert all(float(gbs) > 0 for *_, gbs in rows)
