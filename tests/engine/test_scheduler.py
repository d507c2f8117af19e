"""Scheduler behaviour without a model: budgets, chunking, preemption, priority."""
from inferq.gpuworker.engine.kv_cache_manager import KVCacheManager
from inferq.gpuworker.engine.request import Request, RequestStatus
from inferq.gpuworker.engine.scheduler import Scheduler
from inferq.schemas import SamplingParams


def make(num_blocks=64, block_size=4, seqs=8, budget=16, policy="fcfs", caching=True):
    kv = KVCacheManager(num_blocks, block_size, caching)
    return Scheduler(kv, max_num_seqs=seqs, max_num_batched_tokens=budget, policy=policy), kv


def req(rid, n, prio=0, t=0.0):
    return Request(rid, list(range(1000 * (hash(rid) % 7), 1000 * (hash(rid) % 7) + n)), SamplingParams(), prio, t)


def fake_sample(out):
    """What the engine does after a forward: sampling requests get a token."""
    for s in out.scheduled:
        if s.samples:
            s.request.append_output_token(1)


def test_long_prompt_is_chunked_and_decodes_keep_running():
    s, kv = make(budget=8)
    short = req("short", 3, t=0)
    s.add(short)
    out = s.schedule()
    assert [(x.request.request_id, x.num_new_tokens) for x in out.scheduled] == [("short", 3)]
    fake_sample(out)
    long = req("long", 20, t=1)
    s.add(long)
    plan = []
    for _ in range(3):
        out = s.schedule()
        plan.append([(x.request.request_id, x.num_new_tokens) for x in out.scheduled])
        fake_sample(out)
    # Every step: the decode first (1 token), then a 7-token chunk of the long prompt.
    assert plan == [[("short", 1), ("long", 7)], [("short", 1), ("long", 7)], [("short", 1), ("long", 6)]]
    assert long.num_output_tokens == 1  # sampled only after the last chunk
    kv.check_invariants(s.live_request_ids())


def test_budget_and_max_num_seqs_bound_each_step():
    s, kv = make(budget=10, seqs=2)
    for i in range(4):
        s.add(req(f"r{i}", 4, t=i))
    out = s.schedule()
    assert len(out.scheduled) == 2 and out.num_tokens == 8
    assert s.num_waiting == 2


def test_preemption_by_recompute_frees_latest_request():
    # 4 blocks of 4 tokens: two 8-token prompts fill the pool.
    s, kv = make(num_blocks=4, block_size=4, budget=64, caching=False)
    a, b = req("a", 8, t=0), req("b", 8, t=1)
    s.add(a)
    s.add(b)
    fake_sample(s.schedule())
    # Both now need a 3rd block for their next token: b (latest) is preempted.
    out = s.schedule()
    assert [x.request.request_id for x in out.scheduled] == ["a"]
    assert out.preempted == [b] and b.status is RequestStatus.PREEMPTED
    assert b.num_computed_tokens == 0 and s.num_preemptions == 1
    kv.check_invariants(s.live_request_ids())


def test_priority_policy_preempts_lowest_priority_and_admits_best_first():
    s, kv = make(num_blocks=4, block_size=4, budget=64, policy="priority", caching=False)
    low, high = req("low", 8, prio=5, t=0), req("high", 8, prio=0, t=1)
    s.add(low)
    s.add(high)
    out = s.schedule()
    assert [x.request.request_id for x in out.scheduled] == ["high", "low"]
    fake_sample(out)
    out = s.schedule()
    assert [x.request.request_id for x in out.scheduled] == ["high"]
    assert out.preempted == [low]
    kv.check_invariants(s.live_request_ids())


def test_finish_frees_blocks_wherever_the_request_is():
    s, kv = make(budget=4)
    a, b = req("a", 8, t=0), req("b", 8, t=1)
    s.add(a)
    s.add(b)
    s.schedule()  # a gets a chunk, b waits
    s.finish(a, "abort")
    s.finish(b, "abort")
    assert not s.has_unfinished()
    assert kv.num_free_blocks == kv.pool.num_blocks
    kv.check_invariants(set())


def test_whole_prompt_mode_does_not_chunk():
    s, kv = make(budget=8)
    s.enable_chunked_prefill = False
    s.add(req("big", 12))
    assert not s.schedule()  # cannot fit a whole 12-token prompt in an 8-token budget
