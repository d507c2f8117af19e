"""n > 1 through a real worker process and redis-server: the reply stream has
every choice's deltas (with index), a per-choice end, and one ``done``; a cancel
ends every choice and gives every block back."""
from __future__ import annotations

import pytest
import redis

from inferq.schemas import keys
from inferq.schemas.events import decode_event
from tests.service.conftest import module_producer, paced_worker, wait_for

MODEL = "tiny-nchoices"


@pytest.fixture(scope="module")
def worker(module_redis, tiny_model, tmp_path_factory):
    yield from paced_worker(module_redis, tiny_model, tmp_path_factory, MODEL, "nch-1")


@pytest.fixture
def p(module_redis):
    yield from module_producer(module_redis, MODEL)


def test_reply_stream_of_n3_job(worker, p, module_redis):
    h = p.submit("three choices", sampling={"max_tokens": 6, "temperature": 0.0, "ignore_eos": True, "n": 3})
    res = h.result(timeout=60)
    r = redis.Redis.from_url(module_redis.url)
    events = [decode_event(f) for _, f in r.xrange(keys.reply(h.id))]
    deltas = [e for e in events if e.type == "delta"]
    assert {e.index for e in deltas} == {0, 1, 2}
    assert sorted(e.index for e in deltas if e.finish_reason == "length") == [0, 1, 2]
    done = [e for e in events if e.type == "done"]
    assert len(done) == 1 and events[-1].type == "done"
    assert [(c.index, c.finish_reason, c.completion_tokens) for c in done[0].choices] == [
        (0, "length", 6), (1, "length", 6), (2, "length", 6)]
    assert res.usage.completion_tokens == 18
    assert [c.text for c in res.choices] == [res.text] * 3


def test_cancel_ends_every_choice_and_frees_blocks(worker, p):
    h = p.submit("cancel us", sampling={"max_tokens": 400, "temperature": 0.0, "ignore_eos": True, "n": 3})
    seen: set[int] = set()
    for _, ev in h.stream(timeout=60):
        if ev.type == "delta":
            seen.add(ev.index)
            if len(seen) == 3:  # every sibling is running
                break
    assert h.cancel() is True
    res = h.result(timeout=30)
    assert res.finish_reason == "abort"
    assert [c.finish_reason for c in res.choices] == ["abort"] * 3
    assert 0 < res.usage.completion_tokens < 3 * 400
    assert h.status()["status"] == "cancelled"
    wait_for(lambda: worker.metric("inferq:num_requests_running") == 0, 10, what="engine idle")
    assert worker.metric("inferq:kv_cache_usage_perc") == 0.0
    assert worker.metric("inferq:engine_invariant_failures_total") == 0
