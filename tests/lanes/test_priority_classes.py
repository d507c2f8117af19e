"""Priority classes across the backlog: a worker takes every waiting
interactive job before any batch job in Redis, and the engine preempts a
running batch job for an interactive one (recompute), which later finishes
with the same greedy text. Assertions are about order, never about time."""
from __future__ import annotations

from inferq.producer import Producer
from inferq.schemas import SamplingParams, keys, records
from inferq.schemas.queues import lanes_of
from tests.service.conftest import wait_for

GREEDY = {"temperature": 0.0, "ignore_eos": True}


def started_at(r, job_id: str) -> float:
    return float(r.hget(keys.job_info(job_id), "started_at") or "inf")


def test_interactive_jobs_start_before_any_waiting_batch_job(module_redis, tiny_model, start_worker):
    served = "prio-order"
    p = Producer(module_redis.url, default_model=served)
    batch = [p.submit(prompt_token_ids=[5, i % 50 + 1], sampling={**GREEDY, "max_tokens": 2}, priority_class="batch")
             for i in range(300)]
    interactive = [p.submit(prompt_token_ids=[7, i + 1], sampling={**GREEDY, "max_tokens": 2}) for i in range(5)]
    # Two lanes: one per class; admission recorded the batch one.
    assert {ln.cls for ln in lanes_of(p.redis, served)} == {"interactive", "batch"}
    start_worker(module_redis.url, tiny_model, served, "w-order", "--max-num-seqs", "4")
    for h in interactive + batch:
        h.result(timeout=300)
    first_batch = min(started_at(p.redis, h.id) for h in batch)
    assert max(started_at(p.redis, h.id) for h in interactive) <= first_batch
    p.close()


def test_a_running_batch_job_is_preempted_for_an_interactive_one(module_redis, tiny_model, start_worker,
                                                                 offline_llm):
    served = "prio-preempt"
    p = Producer(module_redis.url, default_model=served)
    # Paced so the batch jobs are surely mid-run when the interactive one arrives
    # (order, not speed, is asserted: the pace only sets a floor on their length).
    w = start_worker(module_redis.url, tiny_model, served, "w-preempt", "--max-num-seqs", "2",
                     "--interactive-reserve", "2", "--step-pace-s", "0.01", metrics=True)
    prompts = [[3, 9, 27, 4], [8, 6, 4, 2]]
    batch = [p.submit(prompt_token_ids=ids, sampling={**GREEDY, "max_tokens": 200}, priority_class="batch")
             for ids in prompts]
    # Both batch jobs hold the engine's two slots and have produced tokens.
    wait_for(lambda: all(p.redis.xlen(keys.reply(h.id)) >= 3 for h in batch), timeout=120, what="batch jobs running")
    inter = p.submit(prompt_token_ids=[1, 2, 3], sampling={**GREEDY, "max_tokens": 8})
    res = inter.result(timeout=120)
    assert res.finish_reason == "length" and len(res.token_ids) == 8
    # The interactive job finished while both batch jobs were still running...
    assert all(p.redis.hget(keys.job_info(h.id), records.STATUS) == b"running" for h in batch)
    assert w.metric("inferq:num_preemptions_total") >= 1
    # ...and each batch job, preempted and recomputed, ends with its solo greedy text.
    for h, ids in zip(batch, prompts):
        got = h.result(timeout=300)
        want = offline_llm.generate([ids], SamplingParams(max_tokens=200, temperature=0.0, ignore_eos=True))[0]
        assert got.token_ids == want.token_ids
    p.close()
