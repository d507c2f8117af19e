"""A job's n choices as sibling engine requests (gpuworker/service/choices.py),
driven through the worker's engine loop on the real SmolLM2 engine, step by step:
greedy choices equal a single request, and the siblings share the prompt's KV
blocks (prefix cache) instead of holding n copies."""
from __future__ import annotations

import logging
import queue

import pytest

from inferq.schemas import Job, SamplingParams
from inferq.gpuworker.service.engine_loop import EngineLoop
from inferq.gpuworker.service.messages import AbortJob, AddJob, StepOutput
from inferq.gpuworker.service.state import InFlight, JobState

PROMPT = ("Redis streams are an append-only log data structure. Consumer groups let several workers share "
          "one stream, each entry delivered to one consumer, with pending entries tracked until acknowledged. ") * 2


class _NoMetrics:
    def __getattr__(self, name):  # the loop only counts invariant failures, which this test checks itself
        raise AssertionError(f"unexpected metric {name}")


def _loop(engine) -> EngineLoop:
    return EngineLoop(engine, queue.Queue(), queue.Queue(), InFlight(64), _NoMetrics(), logging.getLogger("test"))


def _job_state(loop: EngineLoop, job_id: str, prompt_ids: list[int], **sampling) -> JobState:
    job = Job(id=job_id, model="smol", prompt_token_ids=prompt_ids, sampling=SamplingParams(**sampling))
    st = JobState(job=job, entry_id="0-1", raw=b"", attempt=1, log=logging.getLogger("test"), prompt_ids=prompt_ids)
    loop.inflight.add(st)
    return st


def _run(loop: EngineLoop, st: JobState, on_step=None) -> list:
    """Every job-level delta of ``st`` until its final one."""
    loop._apply(AddJob(st))
    deltas = []
    while True:
        loop._step()
        out = loop.out.get_nowait()
        assert isinstance(out, StepOutput)
        deltas += out.deltas
        if on_step is not None:
            on_step()
        if any(d.finished for d in out.deltas):
            return deltas


def _texts(deltas) -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for d in deltas:
        out.setdefault(d.index, []).extend(d.new_token_ids)
    return out


@pytest.fixture
def engine(smol_llm):
    return smol_llm.engine


def test_n4_greedy_equals_single_and_shares_prompt_blocks(engine):
    loop = _loop(engine)
    ids = engine.tokenizer.encode(PROMPT)
    bs = engine.kv.block_size
    assert len(ids) >= 4 * bs  # several full blocks to share
    single = _run(loop, _job_state(loop, "single", ids, max_tokens=8, temperature=0, ignore_eos=True))
    want = _texts(single)[0]

    held: dict[str, list[int]] = {}

    def sample_blocks():
        for i in range(4):
            rid = "many" if i == 0 else f"many#{i}"
            if rid in engine.requests:
                held[rid] = list(engine.kv.block_ids(rid))

    deltas = _run(loop, _job_state(loop, "many", ids, max_tokens=8, temperature=0, ignore_eos=True, n=4),
                  sample_blocks)
    assert _texts(deltas) == {i: want for i in range(4)}
    final = [d for d in deltas if d.finished]
    assert len(final) == 1 and final[0].request_id == "many"
    assert [c.index for c in final[0].choices] == [0, 1, 2, 3]
    assert final[0].num_output_tokens == 4 * 8
    # Each choice ended on a delta of its own (three before the final one).
    assert sorted(d.index for d in deltas if d.choice_end) == [0, 1, 2, 3]

    full = (len(ids) - 1) // bs  # full prompt blocks (a hit never covers the last prompt token)
    tables = [held[r] for r in sorted(held)]
    assert len(tables) == 4
    assert all(t[:full] == tables[0][:full] for t in tables)  # the very same blocks
    used = len(set().union(*tables))
    per_request = len(tables[0])
    print(f"KV blocks for n=4: {used} (4 separate requests: {4 * per_request}); prompt {len(ids)} tokens")
    assert used <= per_request + 3 * (per_request - full)
    engine.check_invariants()


def test_abort_ends_every_choice_and_frees_their_blocks(engine):
    loop = _loop(engine)
    ids = engine.tokenizer.encode(PROMPT)
    free_before = engine.kv.num_free_blocks
    st = _job_state(loop, "ab", ids, max_tokens=200, temperature=0, ignore_eos=True, n=3)
    loop._apply(AddJob(st))
    while not any(r.startswith("ab#") for r in engine.requests):  # until the siblings joined
        loop._step()
        loop.out.get_nowait()
    loop._apply(AbortJob("ab", "abort"))
    out = loop.out.get_nowait()
    final = [d for d in out.deltas if d.finished]
    assert len(final) == 1 and [c.finish_reason for c in final[0].choices] == ["abort"] * 3
    assert not [r for r in engine.requests if r == "ab" or r.startswith("ab#")]
    assert engine.kv.num_free_blocks == free_before
    assert "ab" not in loop._in_engine


def test_abort_before_the_siblings_join_ends_them_too(engine):
    loop = _loop(engine)
    ids = engine.tokenizer.encode(PROMPT)
    st = _job_state(loop, "early", ids, max_tokens=5, n=4)
    loop._apply(AddJob(st))
    loop._apply(AbortJob("early", "deadline"))
    out = loop.out.get_nowait()
    (final,) = [d for d in out.deltas if d.finished]
    assert [c.finish_reason for c in final.choices] == ["deadline"] * 4
    assert not engine.has_unfinished()
