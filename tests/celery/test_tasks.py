"""Celery tasks through a real `celery worker` process and the real Redis broker,
submitting to the real inferq worker (tiny model)."""
import subprocess
import sys
import time

import pytest
import redis

from inferq.producer import Producer
from inferq.schemas.keys import stats as stats_key
from tests.celery.conftest import celery_env
from tests.gateway.stack import TINY

GREEDY = {"max_tokens": 8, "temperature": 0, "ignore_eos": True}


def test_generate_returns_the_job_result(celery_app, stack):
    res = celery_app.generate.delay("The capital of France is", model=TINY, sampling=GREEDY).get(timeout=120)
    assert res["finish_reason"] == "length"
    assert len(res["token_ids"]) == 8 == res["usage"]["completion_tokens"]
    direct = Producer(stack.url).job(res["job_id"]).result(timeout=5)
    assert res["text"] == direct.text and res["token_ids"] == direct.token_ids


def test_generate_is_idempotent_per_task_id(celery_app):
    # A redelivered task (acks_late) has the same id: it must wait for the same job.
    a = celery_app.generate.apply_async(("Hello",), {"model": TINY, "sampling": GREEDY}, task_id="fixed-task-1")
    first = a.get(timeout=120)
    b = celery_app.generate.apply_async(("Hello",), {"model": TINY, "sampling": GREEDY}, task_id="fixed-task-1")
    assert b.get(timeout=120)["job_id"] == first["job_id"]
    assert celery_app.generate.acks_late is True


def test_generate_many_fans_out_and_keeps_order(celery_app, stack):
    prompts = ["One", "Two two", "Three three three"]
    items = [{"prompt": p} for p in prompts] + [{"messages": [{"role": "user", "content": "Hi"}]}]
    results = celery_app.generate_many.delay(items, model=TINY, sampling=GREEDY).get(timeout=180)
    assert len(results) == 4 and len({r["job_id"] for r in results}) == 4
    p = Producer(stack.url)
    for prompt, r in zip(prompts, results):
        alone = p.submit(prompt, model=TINY, sampling=GREEDY).result(timeout=60)
        assert r["text"] == alone.text  # greedy: same prompt, same text, same position
    assert celery_app.generate_many.delay([], model=TINY).get(timeout=30) == []


def test_generate_failure_surfaces_the_worker_error(celery_app):
    with pytest.raises(Exception, match="invalid_prompt"):
        celery_app.generate.delay(prompt_token_ids=[10**7], model=TINY, sampling={"max_tokens": 2}).get(timeout=60)


def test_maintenance_task_runs_on_the_worker(celery_app):
    report = celery_app.maintain_queues.delay().get(timeout=60)
    assert TINY in report
    assert report[TINY]["live_workers"] >= 1
    stats = celery_app.export_queue_stats.delay().get(timeout=60)
    assert any(s["model"] == TINY and s["workers_alive"] >= 1 for s in stats)
    assert isinstance(celery_app.expire_replies.delay().get(timeout=60), int)


def test_beat_schedules_the_maintenance(celery_worker, stack, tmp_path):
    r = redis.Redis.from_url(stack.url)
    r.delete(stats_key(TINY))
    beat = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "inferq.producer.celery_app", "beat", "-s", str(tmp_path / "schedule"),
         "-l", "info"], cwd=tmp_path, env=celery_env(stack, INFERQ_MAINTENANCE_INTERVAL="1"),
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        end = time.monotonic() + 45
        while not r.exists(stats_key(TINY)):
            assert time.monotonic() < end, "beat never got export_queue_stats run"
            time.sleep(0.3)
        assert int(r.hget(stats_key(TINY), "workers_alive")) >= 1
    finally:
        beat.terminate()
        beat.wait(20)


def test_generate_with_a_json_schema(celery_app):
    # The constraint travels in the task's sampling dict; even the tiny random model
    # can only write what the schema allows.
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"], "additionalProperties": False}
    res = celery_app.generate.delay("Answer", model=TINY, sampling={"max_tokens": 20, "temperature": 0.8, "seed": 1,
                                                                     "structured_outputs": {"json": schema}}).get(timeout=120)
    assert res["finish_reason"] == "stop"
    import json
    assert isinstance(json.loads(res["text"])["ok"], bool)
    with pytest.raises(Exception, match="uniqueItems"):
        celery_app.generate.delay("x", model=TINY, sampling={"structured_outputs": {"json": {"uniqueItems": True}}}).get(timeout=60)
