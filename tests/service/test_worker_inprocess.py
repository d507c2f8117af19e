"""The worker's threads in this process around a real engine: engine faults
(injected into step) and coalesced publishing. Faster than a subprocess, and
lets the test reach into the engine."""
from __future__ import annotations

import pytest
import redis

from inferq.producer import JobFailed, Producer
from inferq.schemas import SamplingParams, keys

MARKER = 777  # a prompt starting with this token id makes every engine step fail


@pytest.fixture
def make_worker(tiny_model, module_redis):
    from inferq.gpuworker.config import EngineConfig
    from inferq.gpuworker.engine.llm_engine import LLMEngine
    from inferq.gpuworker.service.settings import WorkerSettings
    from inferq.gpuworker.service.worker import Worker

    class FaultyEngine(LLMEngine):
        """Raises inside step() while a marked request is in the engine, the
        way a bad kernel launch or a model bug would surface."""

        def step(self):
            if any(req.prompt_token_ids[0] == MARKER for req in self.requests.values()):
                raise RuntimeError("injected fault")
            return super().step()

    workers = []

    def make(model, **kw):
        engine = FaultyEngine(EngineConfig(model=str(tiny_model), dtype="float32", num_kv_blocks=256, max_num_seqs=16))
        s = WorkerSettings(redis_url=module_redis.url, served_model_name=model, worker_id=f"inproc-{model}",
                           max_num_seqs=16, lease_seconds=1, block_ms=100, check_invariants=True, **kw)
        w = Worker(s, engine=engine)
        w.start()
        workers.append(w)
        return w

    yield make
    for w in workers:
        w.shutdown()


def test_engine_fault_retries_then_dead_letters_and_worker_survives(make_worker, module_redis, offline_llm):
    model = "tiny-fault"
    w = make_worker(model, max_deliveries=3)
    p = Producer(module_redis.url, default_model=model)
    r = redis.Redis.from_url(module_redis.url)
    # Submitted together, so the first failing step holds all of them.
    texts = [f"bystander {i}" for i in range(3)]
    params = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
    bystanders = [p.submit(t, sampling=params) for t in texts]
    poison = p.submit(prompt_token_ids=[MARKER, 5, 6], sampling={"max_tokens": 5, "temperature": 0})
    with pytest.raises(JobFailed) as e:
        poison.result(timeout=120)
    assert e.value.code == "engine_error" and "injected fault" in e.value.message
    types = [ev.type for _, ev in poison.stream(timeout=5, raw=True)]
    assert types.count("restarted") == 2 and types[-1] == "error"  # 3 attempts, then given up
    dlq = r.xrange(keys.dlq(model))
    assert len(dlq) == 1 and dlq[0][1][b"code"] == b"engine_error" and dlq[0][1][b"attempts"] == b"3"
    # Jobs that shared the failing step are retried on probation and finish correctly.
    expected = offline_llm.generate(texts, params)
    for h, exp in zip(bystanders, expected):
        res = h.result(timeout=120)
        assert res.text == exp.text and res.attempt <= 3
    # The worker is still serving, and its block pool is consistent.
    ok = p.submit("after the fault", sampling={"max_tokens": 6, "temperature": 0})
    expected = offline_llm.generate(["after the fault"], SamplingParams(max_tokens=6, temperature=0))[0]
    assert ok.result(timeout=60).text == expected.text
    w.engine_loop.engine.check_invariants()
    assert w.metrics.invariant_failures._value.get() == 0
    assert r.xlen(keys.jobs(model)) == 0 and r.xpending(keys.jobs(model), keys.JOBS_GROUP)["pending"] == 0
    p.close()
    r.close()


def test_coalesced_publishing_gives_the_same_text(make_worker, module_redis, offline_llm):
    model = "tiny-coalesce"
    w = make_worker(model, coalesce_deltas=True, max_flush_steps=64)
    p = Producer(module_redis.url, default_model=model)
    prompts = [f"coalesce {i}" for i in range(12)]
    params = SamplingParams(max_tokens=20, temperature=0, ignore_eos=True)
    handles = [p.submit(t, sampling=params) for t in prompts]
    expected = offline_llm.generate(prompts, params)
    for h, exp in zip(handles, expected):
        res = h.result(timeout=120)
        assert res.text == exp.text and res.token_ids == exp.token_ids
    # Merged delta events still carry every token exactly once, in order.
    for h, exp in zip(handles, expected):
        deltas = [ev for _, ev in h.stream(timeout=5) if ev.type == "delta"]
        assert [t for ev in deltas for t in ev.token_ids] == exp.token_ids
        assert "".join(ev.text for ev in deltas) == exp.text
    assert w.publisher.events_written <= 12 * 22  # at most one event per token, plus started and done
    p.close()
