"""Prefix affinity across workers: jobs of one session run on the worker that
served the session last (its prefix cache holds the prompt), and an idle worker
takes such a job when that worker is busy."""
from __future__ import annotations

from inferq.producer import Producer
from inferq.schemas import keys
from inferq.schemas.queues import lanes_of
from tests.service.conftest import wait_for

GREEDY = {"temperature": 0.0, "ignore_eos": True}


def test_a_sessions_jobs_follow_its_worker(module_redis, tiny_model, start_worker):
    served = "affinity-follow"
    for w in ("aff-a", "aff-b"):
        start_worker(module_redis.url, tiny_model, served, w, "--max-num-seqs", "4")
    p = Producer(module_redis.url, default_model=served)
    prefix = [11, 12, 13, 14, 15, 16, 17, 18] * 4
    for session in ("s-1", "s-2", "s-3", "s-4"):
        first = p.submit(prompt_token_ids=prefix + [1], sampling={**GREEDY, "max_tokens": 2}, session_id=session)
        first.result(timeout=120)
        home = first.status()["worker"]
        assert p.redis.get(keys.session(served, session)).decode() == home
        for i in range(5):
            h = p.submit(prompt_token_ids=prefix + [i + 2], sampling={**GREEDY, "max_tokens": 2}, session_id=session)
            h.result(timeout=120)
            assert h.status()["worker"] == home
    owners = {ln.owner for ln in lanes_of(p.redis, served)}
    assert owners >= {""} and owners - {""} <= {"aff-a", "aff-b"} and len(owners) >= 2
    p.close()


def test_an_idle_worker_takes_a_session_job_when_its_worker_is_busy(module_redis, tiny_model, start_worker):
    served = "affinity-steal"
    # One slot each. The pace (0.25 s a step: 100 s for the long job) keeps the busy worker
    # busy while the idle one starts, however slow a loaded machine makes that start; the
    # long job is cancelled once the steal is seen, so the pace costs no wall time.
    busy = start_worker(module_redis.url, tiny_model, served, "steal-busy", "--max-num-seqs", "1",
                        "--interactive-reserve", "0", "--step-pace-s", "0.25")
    p = Producer(module_redis.url, default_model=served)
    first = p.submit(prompt_token_ids=[3, 4, 5], sampling={**GREEDY, "max_tokens": 2}, session_id="s-busy")
    first.result(timeout=120)
    assert first.status()["worker"] == busy.worker_id
    long = p.submit(prompt_token_ids=[9, 9, 9], sampling={**GREEDY, "max_tokens": 400})
    wait_for(lambda: long.status()["status"] == "running", timeout=60, what="the long job running")
    start_worker(module_redis.url, tiny_model, served, "steal-idle", "--max-num-seqs", "1",
                 "--steal-after-ms", "100")
    h = p.submit(prompt_token_ids=[3, 4, 5, 6], sampling={**GREEDY, "max_tokens": 2}, session_id="s-busy")
    h.result(timeout=120)
    assert h.status()["worker"] == "steal-idle"
    assert long.status()["status"] == "running"  # taken while its preferred worker was still busy
    assert long.cancel()
    p.close()


def test_a_session_is_derived_from_a_long_shared_prefix():
    """INFERQ_AFFINITY_PREFIX_CHARS: prompts that share their first N characters
    (a system prompt, a document) get one session; short prompts get none; an
    explicit session_id is kept."""
    from inferq.producer.affinity import with_session
    from inferq.producer.settings import ProducerSettings
    from inferq.schemas.job import Job

    s = ProducerSettings(affinity_prefix_chars=64)
    doc = "You are a careful assistant. Here is the contract to review: " + "clause " * 20
    a = with_session(Job(model="m", prompt=doc + "What is the term?"), s)
    b = with_session(Job(model="m", prompt=doc + "Who are the parties?"), s)
    c = with_session(Job(model="m", prompt="Something else entirely. " * 10), s)
    assert a.session_id and a.session_id == b.session_id != c.session_id
    chat = with_session(Job(model="m", messages=[{"role": "system", "content": doc},
                                                  {"role": "user", "content": "hi"}]), s)
    assert chat.session_id and chat.session_id != c.session_id
    assert with_session(Job(model="m", prompt="short"), s).session_id is None
    assert with_session(Job(model="m", prompt=doc, session_id="mine"), s).session_id == "mine"
    assert with_session(Job(model="m", prompt=doc), ProducerSettings()).session_id is None  # off by default
