"""Compute threads pinned to CPUs (inferq_kernels/cpu/binding.py, threads.h's bind_threads): the plan
for each setting on made-up topologies, and real pinning of a real team (in a child process,
so the test process's own threads stay free)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from inferq.kernels.cpu import binding


def topology(cores_per_node: int, nodes: int = 1, smt: int = 1):
    """Linux numbering: cpu c is core c % total_cores, sibling c // total_cores."""
    total = cores_per_node * nodes

    def topo(cpu: int):
        core = cpu % total
        return core // cores_per_node, core

    return list(range(total * smt)), topo


def test_auto_leaves_one_thread_and_an_oversubscribed_team_unpinned():
    cpus, topo = topology(4)
    assert binding.plan(1, "auto", cpus, topo) is None
    assert binding.plan(5, "auto", cpus, topo) is None


def test_auto_takes_the_last_physical_cores_of_the_largest_node():
    cpus, topo = topology(4)
    assert binding.plan(2, "auto", cpus, topo) == [2, 3]
    assert binding.plan(3, "auto", cpus, topo) == [1, 2, 3]
    assert binding.plan(4, "auto", cpus, topo) == [0, 1, 2, 3]
    # two nodes of 4 cores with SMT: cpus 0-7 are cores, 8-15 their siblings
    cpus, topo = topology(4, nodes=2, smt=2)
    assert binding.plan(3, "auto", cpus, topo) == [1, 2, 3]  # one node, no siblings
    assert binding.plan(6, "auto", cpus, topo) == [0, 1, 2, 3, 4, 5]  # spills to node 1's cores
    assert binding.plan(10, "auto", cpus, topo) == [0, 1, 2, 3, 4, 5, 6, 7, 8, 9]  # siblings last
    # a cpuset that leaves node 0 with fewer cores: node 1 comes first
    allowed = [3, 4, 5, 6, 7]
    assert binding.plan(2, "auto", allowed, topo) == [6, 7]


def test_explicit_lists_and_off():
    cpus, topo = topology(8)
    assert binding.plan(3, "6,0-1", cpus, topo) == [6, 0, 1]
    assert binding.plan(2, "0-3", cpus, topo) == [0, 1]
    for off in ("off", "none", "nobind"):
        assert binding.plan(4, off, cpus, topo) is None


@pytest.mark.parametrize("spec,words", [
    ("0-", "not a CPU number"), ("a,b", "not a CPU number"), ("3-1", "backwards"),
    ("1,1", "twice"), ("0,9", "not available"), ("0", "1 CPUs listed for 2 threads"),
])
def test_bad_settings_are_refused_with_the_reason(spec, words):
    cpus, topo = topology(8)
    with pytest.raises(ValueError, match=words):
        binding.plan(2, spec, cpus, topo)


def test_worker_settings_refuse_a_bad_list():
    from inferq.gpuworker.service.settings import WorkerSettings

    with pytest.raises(ValueError, match="INFERQ_CPU_THREADS_BIND"):
        WorkerSettings(cpu_threads_bind="2-1")
    assert WorkerSettings(cpu_threads_bind="0").cpu_threads_bind == "0"


CHILD = textwrap.dedent("""
    import json, os, sys, torch
    from inferq.gpuworker.models import cpu_linear
    from inferq.kernels.cpu import loader, binding
    lib = cpu_linear.load()
    if lib is None or not lib.openmp:
        print(json.dumps({"skip": "no OpenMP kernels"})); sys.exit()
    w = torch.randn(64, 64)
    packed = cpu_linear.PackedWeight(lib, w)
    out = {}
    # the plan is made again when the thread count changes (a setting is read then)
    for step, (n, spec) in enumerate([(2, "auto"), (1, "auto"), (2, "1,0"), (1, "auto"), (2, "off")]):
        os.environ[binding.ENV] = spec
        torch.set_num_threads(n)
        packed(torch.randn(3, 64), None)
        torch.randn(256, 256) @ torch.randn(256, 256)  # torch's own parallel region, same pool
        out[step] = {"team": loader.pinned_cpus(lib, n), "main": sorted(os.sched_getaffinity(0))}
    print(json.dumps(out))
""")


@pytest.mark.skipif(len(binding.ALLOWED) < 2, reason="pinning two threads needs two CPUs")
def test_a_real_team_is_pinned_and_let_go():
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = {**os.environ, "PYTHONPATH": root}
    env.pop(binding.ENV, None)
    done = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    if "skip" in got:
        pytest.skip(got["skip"])
    want = binding.plan(2, "auto")
    assert got["0"]["team"] == want  # thread i on CPU i of the plan
    assert got["0"]["main"] == [want[0]]  # the calling thread is team thread 0
    assert got["1"] == {"team": [-1], "main": binding.ALLOWED}  # back to one thread: free again
    assert got["2"]["team"] == [1, 0]
    assert got["4"] == {"team": [-1, -1], "main": binding.ALLOWED}  # off: nobody pinned, the pool freed


def test_worker_default_is_every_allowed_cpu_but_one(monkeypatch):
    import torch

    from inferq.gpuworker.service.settings import WorkerSettings
    from inferq.gpuworker.service.worker import set_cpu_threads

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv(binding.ENV, raising=False)
    old = torch.get_num_threads()
    try:
        n = set_cpu_threads(WorkerSettings(device="cpu", cpu_threads_bind="off"))
        assert n == max(1, len(binding.ALLOWED) - 1) == torch.get_num_threads()
        assert os.environ[binding.ENV] == "off"  # what the kernels' loader reads
    finally:
        torch.set_num_threads(old)
        os.environ.pop(binding.ENV, None)
