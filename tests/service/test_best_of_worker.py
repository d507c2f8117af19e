"""best_of > n through a real worker process and redis-server: a cancelled job ends
every sequence, publishes only the best n, and gives every block back."""
from __future__ import annotations

import pytest

from tests.service.conftest import module_producer, paced_worker, wait_for

MODEL = "tiny-bestof"


@pytest.fixture(scope="module")
def worker(module_redis, tiny_model, tmp_path_factory):
    yield from paced_worker(module_redis, tiny_model, tmp_path_factory, MODEL, "bestof-1")


@pytest.fixture
def p(module_redis):
    yield from module_producer(module_redis, MODEL)


def test_cancelled_best_of_job_ends_every_sequence_and_frees_blocks(worker, p):
    h = p.submit("cancel us", sampling={"max_tokens": 400, "temperature": 1.0, "seed": 3, "ignore_eos": True,
                                        "best_of": 3, "n": 2})
    # Nothing is published while the sequences run: watch the engine instead.
    wait_for(lambda: worker.metric("inferq:num_requests_running") == 3, 30, what="every sequence running")
    assert h.cancel() is True
    res = h.result(timeout=30)
    assert res.finish_reason == "abort"
    assert [(c.index, c.finish_reason) for c in res.choices] == [(0, "abort"), (1, "abort")]
    assert 0 < res.usage.completion_tokens < 3 * 400
    assert h.status()["status"] == "cancelled"
    wait_for(lambda: worker.metric("inferq:num_requests_running") == 0, 10, what="engine idle")
    assert worker.metric("inferq:kv_cache_usage_perc") == 0.0
    assert worker.metric("inferq:engine_invariant_failures_total") == 0


def test_best_of_over_the_cap_is_refused_on_the_queue(p):
    with pytest.raises(ValueError, match="best_of=17 exceeds the limit of 16"):
        p.submit("x", sampling={"best_of": 17})
