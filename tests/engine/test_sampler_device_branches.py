"""Every sampler test again on the branches a GPU tensor takes (on CPU tensors).

On a GPU the sampler must not read the device to decide anything, so its device
branches differ from the CPU's: argmax instead of the blocked argmax, top-p rows
on the sorted path instead of rejection, the whole group as one chunk, a full
cumsum for the inverse CDF. ``_reads_are_free`` answering False makes the
sampler take them here; the tests of test_sampler.py and
test_sampler_vllm_order.py (distributions, seeds, penalties, logprobs modes,
vLLM's order of operations) must hold there too.
"""
from __future__ import annotations

import pytest

import inferq.gpuworker.engine.sampler as smp
from tests.engine.test_sampler import *  # noqa: F401,F403  (collected again under the fixture below)
from tests.engine.test_sampler_vllm_order import *  # noqa: F401,F403


@pytest.fixture(autouse=True)
def _device_branches(monkeypatch):
    monkeypatch.setattr(smp, "_reads_are_free", lambda device: False)
