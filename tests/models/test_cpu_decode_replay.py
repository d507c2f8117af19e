"""The CPU decode replay (gpuworker/models/cpu_decode_replay.py) gives the forward's bits.

A tiny random Llama on the C kernels, float32 and bfloat16: the same greedy and seeded
tokens with the replay on and off, at 1 to 3 rows a step (requests joining and leaving), the
replay's own first-step check passing at every row count it ran (it turns itself off on any
difference), and a replayed step's hidden states equal to the forward's, bit for bit.
"""
from __future__ import annotations

import pytest
import torch

from inferq.gpuworker import LLM
from inferq.gpuworker.attention.cpu_kernels import load as load_cpu_kernels
from inferq.gpuworker.models import cpu_decode_replay, cpu_linear, cpu_step_program
from inferq.schemas import SamplingParams
from tests import openmp_threads, quant_kernels
from tests.tiny_models import save_tiny_model

pytestmark = pytest.mark.skipif(load_cpu_kernels() is None, reason="the CPU C kernels do not build here")


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory):
    return save_tiny_model("llama", tmp_path_factory.mktemp("replay") / "llama")


def _llm(folder, dtype: str) -> LLM:
    torch.set_num_threads(1)
    return LLM(model=str(folder), dtype=dtype, num_kv_blocks=128, max_num_seqs=8, enable_prefix_caching=False)


def _engine(folder, dtype: str) -> LLM:
    llm = _llm(folder, dtype)
    if llm.engine.model.decode_replay is None:
        pytest.skip(f"no decode replay for {dtype} here (a kernel missing)")
    return llm


def _run(llm: LLM, replay) -> list[list[int]]:
    llm.engine.model.decode_replay = replay
    prompts = [[5 + i for i in range(n)] for n in (7, 19, 3)]
    params = [SamplingParams(max_tokens=n, temperature=0, ignore_eos=True) for n in (24, 9, 16)]
    params[1] = SamplingParams(max_tokens=9, temperature=0.8, top_p=0.9, seed=11, ignore_eos=True)
    return [o.token_ids for o in llm.generate(prompts, params)]


def _assert_replay_gives_the_forwards_tokens(llm: LLM):
    """The same tokens with the replay off and on, its first-step checks passing at 1-3 rows,
    every step run as one step program (cpu_step_program.py)."""
    replay = llm.engine.model.decode_replay
    expected = _run(llm, None)
    got = _run(llm, replay)
    assert got == expected
    assert replay.enabled, "the replay's first-step check found a difference from the forward"
    assert {1, 2, 3} <= replay._checked, f"replayed row counts {sorted(replay._checked)}"
    kinds = set()
    for b, rec in replay._recordings.items():
        for kind, steps in rec.steps[1].items():
            assert isinstance(steps, cpu_step_program.StepProgram), f"{b} rows, {kind}: no step program"
            kinds.add(kind)
    # the runner's decode steps end in the program: greedy batches with their tokens, the batches
    # with a sampled request with their logits
    assert {cpu_decode_replay.TOKENS, cpu_decode_replay.LOGITS} <= kinds, kinds
    # one logits buffer for every row count (not one per recording)
    shared = replay._head_buffers[0]
    assert all(rec.head[2].data_ptr() == shared.data_ptr() for rec in replay._recordings.values())
    return replay


def test_python_loop_gives_the_step_programs_tokens(tiny_folder, monkeypatch):
    """Where the step program cannot be made, the recorded calls run from a Python loop: the
    same tokens, the replay's checks passing."""
    llm = _engine(tiny_folder, "float32")
    replay = llm.engine.model.decode_replay
    with_program = _run(llm, replay)
    replay.forget()
    monkeypatch.setattr(cpu_step_program, "load", lambda: None)
    assert _run(llm, replay) == with_program == _run(llm, None)
    assert replay.enabled and {1, 2, 3} <= replay._checked
    assert all(isinstance(steps, cpu_step_program.PythonSteps)
               for rec in replay._recordings.values() for steps in rec.steps[1].values())


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_replay_gives_the_forwards_tokens(tiny_folder, dtype):
    llm = _llm(tiny_folder, dtype)
    if llm.engine.model.decode_replay is None:
        # Only bf16 on a CPU with no bf16 matmul kernel (AVX512-BF16 / AMX): its weights stay
        # torch tensors, so there is nothing to replay and the forward serves every step.
        lib = cpu_linear.load()
        assert dtype == "bfloat16" and (lib is None or lib.bf16 is None)
        assert [len(t) for t in _run(llm, None)] == [24, 9, 16]
        return
    _assert_replay_gives_the_forwards_tokens(llm)
    llm.engine.check_invariants()


@pytest.mark.parametrize("ending", ["hidden", "logits", "tokens"])
def test_replayed_step_equals_forward_bit_for_bit(tiny_folder, ending):
    """After the checked first step, later replays are compared here directly: the hidden rows
    (the runner's LM head off the program), or the program's logits and greedy tokens, these
    from the steps whose inputs the runner wrote straight into the replay's buffers."""
    from inferq.gpuworker.engine.sampler import greedy_argmax

    llm = _engine(tiny_folder, "float32")
    eng = llm.engine
    model = eng.model
    replay = model.decode_replay
    runner = eng.runner
    runner._direct_decode = ending != "hidden"  # with the LM head off the program, the general path
    temperature = 0.0 if ending != "logits" else 0.7
    eng.add_request("r", list(range(10, 30)), SamplingParams(max_tokens=12, temperature=temperature, seed=3,
                                                             ignore_eos=True))
    seen = []

    def forward(ids, positions, kv_caches, meta, keep_rows=None):
        got = replay_forward(ids, positions, kv_caches, meta, keep_rows)
        if replay.applies(ids, positions, kv_caches, meta) and 1 in replay._checked:
            seen.append(torch.equal(got, model.layers_forward(ids, positions, kv_caches, meta)))
        return got

    def replayed_head(ids, positions, kv_caches, meta, greedy):
        if ending == "hidden":
            return None  # the runner takes forward() and the LM head from Python
        assert greedy == (ending == "tokens")
        checked = (1, ending) in replay._checked_kinds
        got = replay_head(ids, positions, kv_caches, meta, greedy)
        if got is not None and checked:
            logits = model.lm_logits(model.layers_forward(ids, positions, kv_caches, meta))
            seen.append(torch.equal(got[0], logits)
                        and (got[1] is None if not greedy else torch.equal(got[1], greedy_argmax(logits))))
        return got

    scheds, direct_steps = [], []

    def direct_inputs(sched, kv):
        scheds.append(sched)
        return runner_direct_inputs(sched, kv)

    def run_inputs(inputs, kind, longest, kv_caches):
        got = replay_run_inputs(inputs, kind, longest, kv_caches)
        ids, positions, meta, *_ = runner.build_metadata(scheds[-1], eng.kv)  # the general path's inputs
        logits = model.lm_logits(model.layers_forward(ids, positions, kv_caches, meta))
        direct_steps.append(torch.equal(got[0], logits)
                            and got[1] == (None if ending == "logits" else greedy_argmax(logits).tolist()))
        return got

    replay_forward, replay_head = model.forward, model.replayed_head
    runner_direct_inputs, replay_run_inputs = runner._direct_inputs, replay.run_inputs
    model.forward, model.replayed_head = forward, replayed_head
    runner._direct_inputs, replay.run_inputs = direct_inputs, run_inputs
    try:
        while eng.has_unfinished():
            eng.step()
    finally:
        del model.forward, model.replayed_head, runner._direct_inputs, replay.run_inputs
    seen += direct_steps
    assert len(seen) >= 8 and all(seen), seen
    assert (len(direct_steps) >= 8) == (ending != "hidden"), direct_steps


def test_replay_can_be_switched_off(tiny_folder, monkeypatch):
    monkeypatch.setenv("INFERQ_CPU_DECODE_REPLAY", "0")
    torch.set_num_threads(1)
    llm = LLM(model=str(tiny_folder), dtype="float32", num_kv_blocks=64)
    assert llm.engine.model.decode_replay is None


def test_gguf_native_projections_replay_as_their_kernel_calls(monkeypatch):
    """The bundled Q4_1 model with its blocks as stored: every quantized projection is
    replayed as its own kernel calls (QuantLinear.replay_calls: no tensors made per step), and
    the tokens are the forward's at 1 to 3 rows, the replay's first-step checks passing; the
    embedding lookup, the cos/sin rows and the final norm are ops of the step program too."""
    from inferq.gpuworker.models import cpu_decode_replay
    from inferq.gpuworker.models.loader import bundled_model_path

    quant_kernels.require()
    monkeypatch.setenv("INFERQ_GGUF_WEIGHTS", "native")
    monkeypatch.setenv("INFERQ_GGUF_ACTIVATIONS", "int8")
    replay = _assert_replay_gives_the_forwards_tokens(_engine(bundled_model_path(), "float32"))
    for rec in replay._recordings.values():
        for pre, qkv, post, mlp, o, down in rec.layers:
            for fn, args in (*qkv, *o, *down, *mlp):
                assert fn is not cpu_decode_replay._call_into, "a quantized projection went through Python"
        # the whole step is the program: the quantized embedding's rows and the positions' cos/sin
        # first, the final norm last
        ops = rec.ops(rec.steps[0])
        assert rec.embed is not None and ops[0] is rec.embed and ops[1:3] == rec.rotary_rows and ops[-1] is rec.final


@pytest.mark.parametrize("model", ["float32", "bfloat16", "gguf-native"])
def test_replay_at_two_threads_runs_each_step_as_a_team(tiny_folder, model, monkeypatch):
    """At two threads every decode step's program runs as one team (step_program.c's run_team:
    one parallel region, each kernel the calling thread's share) wherever its kernels all share
    their work, which is all but the AMX bf16 matmuls: the forward's tokens, the replay's
    first-step checks passing at 1-3 rows."""
    from inferq.gpuworker.models.loader import bundled_model_path

    openmp_threads.require()
    if model == "gguf-native":
        quant_kernels.require()
        monkeypatch.setenv("INFERQ_GGUF_WEIGHTS", "native")
        monkeypatch.setenv("INFERQ_GGUF_ACTIVATIONS", "int8")
        llm = _engine(bundled_model_path(), "float32")
    else:
        llm = _engine(tiny_folder, model)
    torch.set_num_threads(2)
    try:
        replay = _assert_replay_gives_the_forwards_tokens(llm)
    finally:
        torch.set_num_threads(1)
    amx_bf16 = model == "bfloat16" and cpu_linear.load().bf16 == "amx"
    programs = [steps for rec in replay._recordings.values() for steps in rec.steps[1].values()]
    assert programs and all(steps.team is not amx_bf16 for steps in programs)
    assert replay.kernels.lib.threads == 2  # the steps ran at two threads


def test_an_input_out_of_range_is_an_index_error_and_leaves_the_replay_on(monkeypatch):
    """An id past the embedding (the quantized lookup in the program) or a position past the
    rotary table fails the step with IndexError, as the forward's lookups do, and the replay
    stays on for the steps after it."""
    from inferq.gpuworker.models.loader import bundled_model_path

    quant_kernels.require()
    monkeypatch.setenv("INFERQ_GGUF_WEIGHTS", "native")
    llm = _engine(bundled_model_path(), "float32")
    model = llm.engine.model
    replay = model.decode_replay
    seen = []
    real = model.replayed_head

    def keep_inputs(ids, positions, kv_caches, meta, greedy):
        seen.append((ids.clone(), positions.clone(), kv_caches, meta))
        return real(ids, positions, kv_caches, meta, greedy)

    monkeypatch.setattr(model, "replayed_head", keep_inputs)
    run_inputs = replay.run_inputs

    def count_direct(*args):  # the steps whose inputs the runner wrote into the replay's buffers
        seen.append(None)
        return run_inputs(*args)

    monkeypatch.setattr(replay, "run_inputs", count_direct)
    llm.generate([[5, 6, 7]], SamplingParams(max_tokens=4, temperature=0, ignore_eos=True))
    ids, positions, kv_caches, meta = next(x for x in reversed(seen) if x is not None)
    assert replay._recordings and replay.enabled
    vocab, max_pos = model.packed_embed.n, model.rotary.cos.shape[0]
    for bad_ids, bad_positions in ((torch.tensor([vocab]), positions), (ids, torch.tensor([max_pos]))):
        with pytest.raises(IndexError):
            real(bad_ids, bad_positions, kv_caches, meta, True)
        assert replay.enabled
    before = len(seen)
    out = llm.generate([[5, 6, 7]], SamplingParams(max_tokens=4, temperature=0, ignore_eos=True))
    assert len(seen) > before and len(out[0].token_ids) == 4 and replay.enabled


def test_logprobs_and_penalties_through_the_replayed_head(tiny_folder):
    """Requests that need the full logits (logprobs, penalties, logit bias) beside greedy ones:
    the same tokens and logprobs with the replay on and off."""
    llm = _engine(tiny_folder, "float32")
    prompts = [[5 + i for i in range(n)] for n in (7, 12, 4)]
    params = [SamplingParams(max_tokens=10, temperature=0, logprobs=3, ignore_eos=True),
              SamplingParams(max_tokens=10, temperature=0, presence_penalty=0.5, frequency_penalty=0.3,
                             logit_bias={7: 2.0}, ignore_eos=True),
              SamplingParams(max_tokens=10, temperature=0, ignore_eos=True)]
    replay = llm.engine.model.decode_replay

    def run(on):
        llm.engine.model.decode_replay = replay if on else None
        outs = llm.generate(prompts, params)
        return [o.token_ids for o in outs], [o.logprobs for o in outs]

    on = run(True)
    assert on == run(False)
    assert len(on[1][0]) == 10 and all(len(top) >= 3 for top in on[1][0])  # the logprobs came back
    assert replay.enabled and any(kind == cpu_decode_replay.LOGITS for _, kind in replay._checked_kinds)


def test_direct_decode_inputs_give_the_general_paths_tokens(tiny_folder):
    """Decode steps whose inputs the runner writes straight into the replay's buffers
    (ModelRunner._direct_inputs, cpu_decode_replay.DecodeInputs) give the tokens of the general
    input build and of the forward: with rows shifting as requests finish, block tables growing
    across many block boundaries, and requests preempted for KV blocks and resumed on new
    blocks (each row's table copied again), greedy and seeded rows together."""
    torch.set_num_threads(1)
    llm = LLM(model=str(tiny_folder), dtype="float32", block_size=4, num_kv_blocks=18, max_num_seqs=4,
              enable_prefix_caching=False)
    eng = llm.engine
    replay, runner = eng.model.decode_replay, eng.runner
    # float32 replays wherever the C kernels build (this module's mark): only bf16 may lack it
    assert replay is not None, "no float32 decode replay although the CPU kernels built"
    prompts = [[5 + 3 * i + j for j in range(5 + 2 * i)] for i in range(5)]
    params = [SamplingParams(max_tokens=14 + 3 * i, temperature=0, ignore_eos=True) for i in range(5)]
    params[2] = SamplingParams(max_tokens=20, temperature=0.9, top_p=0.9, seed=5, ignore_eos=True)
    direct = []
    run_inputs = replay.run_inputs

    def counted(*args):
        direct.append(len(args[0].ids_mv))
        return run_inputs(*args)

    def run(direct_on: bool, replay_on: bool) -> list[list[int]]:
        runner._direct_decode = direct_on
        eng.model.decode_replay = replay if replay_on else None
        before = eng.scheduler.num_preemptions
        out = [o.token_ids for o in llm.generate(prompts, params)]
        assert eng.scheduler.num_preemptions > before, "the KV cache was meant to force preemptions"
        eng.check_invariants()
        return out

    replay.run_inputs = counted
    try:
        got = run(True, True)
    finally:
        del replay.run_inputs
    assert replay.enabled and len(set(direct)) >= 3, f"direct steps at row counts {sorted(set(direct))}"
    assert got == run(False, True) == run(False, False)


@pytest.mark.parametrize("direct", [True, False])
def test_a_refusing_kernel_turns_the_replay_off_and_the_step_takes_the_forward(tiny_folder, monkeypatch, direct,
                                                                              caplog):
    """A kernel returning non-zero inside the step program (after the step's inputs were read)
    turns the replay off for good; that step and the later ones come from the forward, the
    tokens unchanged, whether the runner wrote the inputs directly or through its general build."""
    llm = _engine(tiny_folder, "float32")
    eng = llm.engine
    replay = eng.model.decode_replay
    prompt, params = [[5, 6, 7]], SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)
    eng.model.decode_replay = None
    expected = llm.generate(prompt, params)[0].token_ids
    eng.model.decode_replay, eng.runner._direct_decode = replay, direct
    assert llm.generate(prompt, params)[0].token_ids == expected  # its 1-row step checked
    assert replay.enabled and replay.ready(1, cpu_decode_replay.TOKENS)
    real_run, paths = cpu_step_program.StepProgram.run, []
    monkeypatch.setattr(replay, "run_inputs", lambda *a: paths.append("direct") or type(replay).run_inputs(replay, *a))

    def refuse_once(self, team=True):
        monkeypatch.setattr(cpu_step_program.StepProgram, "run", real_run)
        real_run(self, team)
        return 7, len(self) - 1  # the program's last op said no

    monkeypatch.setattr(cpu_step_program.StepProgram, "run", refuse_once)
    with caplog.at_level("WARNING"):
        assert llm.generate(prompt, params)[0].token_ids == expected
    assert not replay.enabled and "refused by a kernel (rc 7)" in caplog.text
    assert paths == (["direct"] if direct else [])  # the refused step took the path under test
