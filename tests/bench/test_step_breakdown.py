"""``inferq bench step-breakdown`` on a tiny random Llama: every part of a batch-1 decode step
is measured for the layer-by-layer forward and the decode replay (its inputs written directly
or through the runner's general input build), the parts add up to the
traced step, the C kernels' share of a part never exceeds the part, and the weight stream of
the step's bytes is measured beside them. (No claim on speed: the figures are noisy here.)"""
from __future__ import annotations

import argparse

import pytest
import torch

from inferq.bench import step_breakdown
from inferq.gpuworker.attention.cpu_kernels import load as load_cpu_kernels
from tests import openmp_threads
from tests.tiny_models import save_tiny_model

pytestmark = pytest.mark.skipif(load_cpu_kernels() is None, reason="the CPU C kernels do not build here")


def test_breakdown_of_forward_and_replay(tmp_path):
    folder = save_tiny_model("llama", tmp_path / "llama")
    args = argparse.Namespace(dtype="float32", prompt_len=16, steps=3, rounds=2, forward=True, general_inputs=True,
                              op_by_op=False, threads=1)
    torch.set_num_threads(1)
    results = step_breakdown.run_model(str(folder), args)
    assert [r["variant"] for r in results] == ["forward", "replay", "replay, general inputs"]
    for r in results:
        parts, c = r["parts_ms"], r["c_ms"]
        assert set(parts) == set(step_breakdown.PARTS)
        assert parts["linear"] > 0 and parts["attention"] > 0 and parts["LM head"] > 0 and parts["sampler"] > 0
        for p in step_breakdown.PARTS:
            assert c[p] <= parts[p] + 1e-9, (r["variant"], p, c[p], parts[p])
        assert r["stream_ms"] > 0 and r["ratio"] == pytest.approx(r["plain_step_ms"] / r["stream_ms"])
        assert r["bytes"] > 0
    # the replay calls the kernels straight from its recording: no time in the forward's op wrappers
    forward, replay, general = results
    assert forward["c_ms"]["linear"] < forward["parts_ms"]["linear"]
    for r in (replay, general):
        assert r["c_ms"]["linear"] == pytest.approx(r["parts_ms"]["linear"])


def test_op_by_op_variant_runs_the_step_programs_without_a_team(tmp_path, monkeypatch):
    """``--op-by-op`` at two threads: the replay's step programs run as one team in the replay's
    rounds and op by op in the added variant's, and the engine is left with its teams on."""
    from inferq.gpuworker.models import cpu_step_program

    openmp_threads.require()
    seen = set()
    run = cpu_step_program.StepProgram.run

    def spy(self, team=True):
        seen.add(self.team and team)
        return run(self, team)

    monkeypatch.setattr(cpu_step_program.StepProgram, "run", spy)
    folder = save_tiny_model("llama", tmp_path / "llama")
    args = argparse.Namespace(dtype="float32", prompt_len=16, steps=3, rounds=2, forward=False, general_inputs=False,
                              op_by_op=True, threads=2)
    torch.set_num_threads(2)
    try:
        results = step_breakdown.run_model(str(folder), args)
    finally:
        torch.set_num_threads(1)
    assert [r["variant"] for r in results] == ["replay", "replay, op by op"]
    assert seen == {True, False}, "the programs ran as a team in one variant and op by op in the other"


def test_parts_are_exclusive(tmp_path):
    """Within one traced step no time is counted twice: the parts other than the remainder
    fit in the step, and the forward's parts in the forward."""
    from inferq.gpuworker import LLM
    from inferq.schemas import SamplingParams

    folder = save_tiny_model("llama", tmp_path / "llama")
    torch.set_num_threads(1)
    engine = LLM(model=str(folder), dtype="float32", num_kv_blocks=64).engine
    engine.add_request("r", list(range(5, 25)), SamplingParams(max_tokens=12, temperature=0, ignore_eos=True))
    for replay in (None, engine.model.decode_replay):
        engine.model.decode_replay = replay
        for _ in range(3):
            total, row, c = step_breakdown.traced_step(engine)
            assert row["Python remainder"] >= 0 and row["model glue"] >= 0, row
            assert sum(row.values()) == pytest.approx(total)
            assert all(c[p] <= row[p] + 1e-9 for p in c), (row, c)


def test_tracing_leaves_the_engine_as_it_was(tmp_path):
    from inferq.gpuworker import LLM
    from inferq.gpuworker.models import llama

    folder = save_tiny_model("llama", tmp_path / "llama")
    torch.set_num_threads(1)
    engine = LLM(model=str(folder), dtype="float32", num_kv_blocks=64).engine
    before = (llama.linear, llama.add_rms_norm, engine.scheduler.__dict__.get("schedule"),
              dict(engine.model.layers[0].cpu_kernels.fns))
    with step_breakdown.traced(engine):
        assert llama.linear is not before[0]
    after = (llama.linear, llama.add_rms_norm, engine.scheduler.__dict__.get("schedule"),
             dict(engine.model.layers[0].cpu_kernels.fns))
    assert after == before
    assert "forward" not in engine.model.__dict__
