"""Priority preemption: under the "priority" policy a waiting request of strictly
better priority evicts the worst running request(s) (recompute) when it cannot
get a seat (max_num_seqs) or KV blocks; FCFS never does. The evicted requests
resume by recomputing prompt + generated tokens and finish with the same greedy
tokens and text as when they run alone."""
from __future__ import annotations

import pytest
import torch

from inferq.gpuworker.engine.kv_cache_manager import KVCacheManager
from inferq.gpuworker.engine.request import Request, RequestStatus
from inferq.gpuworker.engine.scheduler import Scheduler
from inferq.schemas import SamplingParams


# -- scheduler level (no model) --------------------------------------------------

def make(num_blocks=64, block_size=4, seqs=8, budget=64, policy="priority", caching=False):
    kv = KVCacheManager(num_blocks, block_size, caching)
    return Scheduler(kv, max_num_seqs=seqs, max_num_batched_tokens=budget, policy=policy), kv


def req(rid, tokens, prio, t):
    if isinstance(tokens, int):
        base = 100 * (sum(map(ord, rid)) % 50)
        tokens = list(range(base, base + tokens))
    return Request(rid, tokens, SamplingParams(), prio, t)


def step(s, kv):
    """schedule() plus what the engine does after the forward: publish full
    blocks, and give every sampling request a token."""
    out = s.schedule()
    for x in out.scheduled:
        kv.cache_computed_blocks(x.request)
        if x.samples:
            x.request.append_output_token(7)
    kv.check_invariants(s.live_request_ids())
    return out


def ids(out):
    return [x.request.request_id for x in out.scheduled]


BOUNDS = {
    # max_num_seqs=2: both seats taken.
    "seats": dict(seqs=2, num_blocks=64),
    # Seats to spare, but 7 blocks of 4: the two requests hold 3 each (their next
    # decode opens a third block), one is left for a 5-token prompt that needs 2.
    "blocks": dict(seqs=8, num_blocks=7),
}


def two_low_priority_decoding(policy, bound):
    """Two priority-10 requests three tokens into decode, leaving no room for one more."""
    s, kv = make(policy=policy, **BOUNDS[bound])
    lo1, lo2 = req("lo1", 6, 10, t=1.0), req("lo2", 6, 10, t=2.0)
    s.add(lo1)
    s.add(lo2)
    for _ in range(3):
        assert ids(step(s, kv)) == ["lo1", "lo2"]
    assert lo1.num_output_tokens == lo2.num_output_tokens == 3
    return s, kv, lo1, lo2


@pytest.mark.parametrize("bound", BOUNDS)
def test_better_priority_preempts_exactly_the_worst_running_request(bound):
    s, kv, lo1, lo2 = two_low_priority_decoding("priority", bound)
    hi = req("hi", 5, 0, t=3.0)
    s.add(hi)
    out = step(s, kv)
    # lo2 is the worst: same priority as lo1, later arrival. lo1 keeps decoding.
    assert out.preempted == [lo2]
    assert ids(out) == ["lo1", "hi"]
    assert lo2.status is RequestStatus.PREEMPTED and lo2.num_computed_tokens == 0
    assert lo2.num_preemptions == 1 and lo1.num_preemptions == 0
    assert s.num_preemptions == 1 and s.num_priority_preemptions == 1
    # lo2's decode token was handed back: the step holds lo1's decode and hi's prompt only.
    assert out.num_tokens == 1 + 5
    assert kv.block_ids("lo2") == []
    assert s.running == [lo1, hi] and list(s.waiting) == [lo2]

    # lo2 waits while hi holds the room, then resumes by recomputing its prompt
    # and the 3 tokens it had generated (nothing is sampled twice).
    out = step(s, kv)
    assert ids(out) == ["lo1", "hi"] and not out.preempted
    s.finish(hi, "length")
    out = step(s, kv)
    assert ids(out) == ["lo1", "lo2"]
    resumed = next(x for x in out.scheduled if x.request is lo2)
    assert (resumed.num_computed_before, resumed.num_new_tokens) == (0, 6 + 3)
    assert lo2.num_output_tokens == 3 + 1  # sampled once, after the recomputed tokens
    assert s.num_preemptions == 1


@pytest.mark.parametrize("bound", BOUNDS)
@pytest.mark.parametrize("arrival", [3.0, 0.5], ids=["later", "earlier"])
def test_equal_priority_never_preempts(arrival, bound):
    # Equal priority does not preempt, even with an earlier arrival (a better
    # sort key than both running requests): it waits for room.
    s, kv, lo1, lo2 = two_low_priority_decoding("priority", bound)
    s.add(req("eq", 5, 10, t=arrival))
    out = step(s, kv)
    assert not out.preempted and ids(out) == ["lo1", "lo2"]
    assert s.num_preemptions == 0 and s.num_waiting == 1


@pytest.mark.parametrize("bound", BOUNDS)
def test_fcfs_never_preempts_for_a_waiting_request(bound):
    s, kv, lo1, lo2 = two_low_priority_decoding("fcfs", bound)
    s.add(req("hi", 5, 0, t=3.0))
    out = step(s, kv)
    assert not out.preempted and ids(out) == ["lo1", "lo2"]
    assert s.num_preemptions == 0 and s.num_waiting == 1


@pytest.mark.parametrize("with_mid", [True, False], ids=["mid-waiting", "only-hi"])
def test_kv_bound_better_priority_preempts_worst_first_until_it_fits(with_mid):
    # 10 blocks of 4: three 10-token requests (their prompts take two steps of a
    # 24-token budget) hold 3 blocks each once decoding, 1 is free.
    s, kv = make(num_blocks=10, block_size=4, seqs=8, budget=24)
    a, b, c = req("a", 10, 5, t=0.0), req("b", 10, 10, t=1.0), req("c", 10, 10, t=2.0)
    for r in (a, b, c):
        s.add(r)
    step(s, kv)
    step(s, kv)
    assert [r.num_output_tokens for r in (a, b, c)] == [2, 2, 1]
    assert kv.num_free_blocks == 1
    # 20 tokens need 5 blocks: evicting c (3) is not enough, c then b (6) is; a stays.
    hi = req("hi", 20, 0, t=3.0)
    mid = req("mid", 3, 1, t=4.0)
    s.add(hi)
    if with_mid:
        s.add(mid)
    out = step(s, kv)
    assert out.preempted == [c, b]
    assert s.num_priority_preemptions == 2 and s.num_preemptions == 2
    assert a.status is RequestStatus.RUNNING and a.num_preemptions == 0
    plan = [(x.request.request_id, x.num_new_tokens) for x in out.scheduled]
    if with_mid:
        # b's and c's decodes were given back to the budget: after a's decode and
        # hi's 20 tokens, mid gets its whole 3-token prompt (not a 1-token chunk),
        # and the step is exactly full.
        assert plan == [("a", 1), ("hi", 20), ("mid", 3)]
        assert out.num_tokens == 24
        assert kv.num_free_blocks == 10 - 3 - 5 - 1
    else:
        # 3 tokens of budget and 2 blocks are left, enough for a chunk of b: but a
        # request evicted in this step is not taken straight back in it.
        assert plan == [("a", 1), ("hi", 20)]
        assert b.status is c.status is RequestStatus.PREEMPTED
        assert kv.num_free_blocks == 10 - 3 - 5
    # The victims come back once the better requests are done.
    for r in (hi, mid) if with_mid else (hi,):
        s.finish(r, "length")
    out = step(s, kv)
    assert ids(out) == ["a", "b", "c"] and not out.preempted


@pytest.mark.parametrize("hi_len, victims", [(20, ["v"]), (24, [])])
def test_kv_bound_counts_only_blocks_that_would_really_be_freed(hi_len, victims):
    # v shares its first two blocks (prefix cache) with base, which has a better
    # priority than hi: evicting v frees only its own third block. hi preempts v
    # when that is enough, and preempts nobody when it would not be.
    s, kv = make(num_blocks=8, block_size=4, seqs=8, budget=64, caching=True)
    prefix = list(range(500, 508))
    base = req("base", prefix + [1], 0, t=0.0)
    s.add(base)
    step(s, kv)
    v = req("v", prefix + [2], 10, t=1.0)
    s.add(v)
    step(s, kv)
    assert v.num_cached_tokens == 8 and kv.num_free_blocks == 4
    hi = req("hi", hi_len, 5, t=2.0)
    s.add(hi)
    out = step(s, kv)
    assert [r.request_id for r in out.preempted] == victims
    if victims:
        assert ids(out) == ["base", "hi"]
    else:
        assert ids(out) == ["base", "v"] and s.num_waiting == 1 and s.num_preemptions == 0


# -- end to end through the engine (tiny random Llama, greedy) ---------------------

MAX_NEW = 10
GREEDY = SamplingParams(max_tokens=MAX_NEW, temperature=0, ignore_eos=True)


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory):
    from tests.tiny_models import save_tiny_model

    return save_tiny_model("llama", tmp_path_factory.mktemp("prio") / "llama")


def engine(folder, **kw):
    from inferq.gpuworker import LLM

    torch.set_num_threads(1)
    cfg = dict(dtype="float32", block_size=4, max_num_batched_tokens=64, scheduling_policy="priority")
    return LLM(model=str(folder), **{**cfg, **kw}).engine


def drain(eng, deltas, got):
    for d in deltas:
        toks, text, done = got.setdefault(d.request_id, ([], [], []))
        assert not done, f"{d.request_id} got output after it finished"
        toks += d.new_token_ids
        text.append(d.new_text)
        if d.finished:
            done.append(d.finish_reason)


PROMPTS = {
    "lo1": [1000 + 37 * i for i in range(9)],
    "lo2": [20000 + 53 * i for i in range(11)],
    "hi": [31000 + 71 * i for i in range(18)],
}


@pytest.fixture(scope="module")
def alone(tiny_folder):
    """Each prompt run alone on a fresh engine: the reference tokens and text."""
    ref = {}
    for rid, prompt in PROMPTS.items():
        eng = engine(tiny_folder, num_kv_blocks=64)
        eng.add_request(rid, prompt, GREEDY)
        got = {}
        while eng.has_unfinished():
            drain(eng, eng.step(), got)
        toks, text, done = got[rid]
        assert done == ["length"] and len(toks) == MAX_NEW
        ref[rid] = (toks, "".join(text))
    return ref


@pytest.mark.parametrize("bound, kw", [
    # Both seats taken.
    ("seats", dict(max_num_seqs=2, num_kv_blocks=64)),
    # Seats to spare, but lo1 + lo2 (3 + 4 blocks after 3 decodes) leave 3 of 10
    # blocks free and hi's 18-token prompt needs 5.
    ("blocks", dict(max_num_seqs=8, num_kv_blocks=10)),
], ids=["seats", "blocks"])
@pytest.mark.parametrize("caching", [True, False], ids=["prefix-cache", "no-prefix-cache"])
def test_engine_priority_preemption_resumes_with_identical_greedy_output(tiny_folder, alone, bound, kw, caching):
    eng = engine(tiny_folder, enable_prefix_caching=caching, **kw)
    got: dict = {}
    eng.add_request("lo1", PROMPTS["lo1"], GREEDY, priority=10, arrival_time=1.0)
    eng.add_request("lo2", PROMPTS["lo2"], GREEDY, priority=10, arrival_time=2.0)
    lo2 = eng.requests["lo2"]
    for _ in range(3):
        drain(eng, eng.step(), got)
    assert len(got["lo1"][0]) == len(got["lo2"][0]) == 3
    assert eng.stats().num_preemptions == 0

    eng.add_request("hi", PROMPTS["hi"], GREEDY, priority=0, arrival_time=3.0)
    drain(eng, eng.step(), got)
    # hi ran its whole prompt in the very next step and sampled its first token.
    assert len(got["hi"][0]) == 1
    stats = eng.stats()
    assert stats.num_priority_preemptions == stats.num_preemptions == 1
    assert lo2.status is RequestStatus.PREEMPTED and lo2.num_computed_tokens == 0
    assert eng.requests["lo1"].num_preemptions == 0
    eng.check_invariants()

    while eng.has_unfinished():
        drain(eng, eng.step(), got)
        eng.check_invariants()
    assert lo2.num_preemptions >= 1
    for rid, (toks, text) in alone.items():
        g_toks, g_text, done = got[rid]
        assert done == ["length"], rid
        assert g_toks == toks, f"{rid}: tokens differ from its solo run"
        assert "".join(g_text) == text, f"{rid}: text differs from its solo run (duplicated after recompute?)"
    stats = eng.stats()
    assert stats.num_generated_tokens == 3 * MAX_NEW  # nothing sampled twice
    assert stats.num_free_blocks == stats.num_blocks


def test_priority_preemptions_are_their_own_metric_series_and_not_a_kv_shortage():
    from prometheus_client import generate_latest

    from inferq.gpuworker.engine.outputs import EngineStats
    from inferq.gpuworker.metrics import WorkerMetrics
    from inferq.doctor import Sample, diagnose

    def stats(total, priority):
        return EngineStats(num_running=2, num_waiting=1, kv_cache_usage=0.3, num_blocks=100, num_free_blocks=70,
                           prefix_cache_queries=0, prefix_cache_hits=0, num_preemptions=total, num_steps=10,
                           num_generated_tokens=20, num_prompt_tokens=40, num_priority_preemptions=priority)

    m = WorkerMetrics("m")
    m.update_engine(stats(0, 0))
    before = Sample.from_text(generate_latest(m.registry).decode(), at=0.0)
    m.update_engine(stats(5, 4))  # 4 for priority, 1 for blocks
    value = m.registry.get_sample_value
    assert value("inferq:num_preemptions_total", {"model_name": "m", "reason": "priority"}) == 4
    assert value("inferq:num_preemptions_total", {"model_name": "m", "reason": "kv"}) == 1
    after = Sample.from_text(generate_latest(m.registry).decode(), at=10.0)
    assert (after.preemptions, after.priority_preemptions) == (1, 4)
    r = diagnose(before, after)
    assert r.readings["preemptions_in_window"] == 1 and r.readings["priority_preemptions_in_window"] == 4
    # Only priority preemptions: the doctor does not call that a KV shortage.
    m.update_engine(stats(9, 8))
    later = Sample.from_text(generate_latest(m.registry).decode(), at=20.0)
    assert diagnose(after, later).bottleneck != "kv_cache"
