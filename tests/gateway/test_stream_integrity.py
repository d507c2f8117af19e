"""Reply streams are never read silently wrong: a gap in an attempt's events is
an error (502 / an `error` event), a job whose records expire mid-read ends the
stream with `job_expired`, and a Last-Event-ID no client was ever sent is a 400
instead of a stream that waits forever. Reply streams are written by hand here
into a real redis-server, the way a trimmed or expired one would look."""
import uuid

import httpx
import pytest
import redis

from inferq.schemas import DeltaEvent, DoneEvent, RestartedEvent, StartedEvent, encode_event, keys
from tests.gateway.stack import running_gateway
from tests.gateway.test_jobs_api import parse_sse


@pytest.fixture
def r(redis_url):
    c = redis.Redis.from_url(redis_url)
    yield c
    c.close()


def job_with(r, *events) -> str:
    job_id = uuid.uuid4().hex
    r.hset(keys.job_info(job_id), mapping={"status": "running", "model": "m", "tenant": "", "attempt": 1})
    for ev in events:
        r.xadd(keys.reply(job_id), encode_event(ev))
    return job_id


def test_a_gap_is_a_502_and_an_error_event(redis_url, r):
    job = job_with(r, StartedEvent(attempt=1, seq=0), DeltaEvent(attempt=1, seq=2, text="b"),
                   DoneEvent(attempt=1, seq=3, finish_reason="length"))
    with running_gateway(redis_url) as url:
        got = httpx.get(f"{url}/v1/jobs/{job}", timeout=10)
        assert got.status_code == 502 and got.json()["error"]["code"] == "reply_stream_gap"
        with httpx.stream("GET", f"{url}/v1/jobs/{job}/events", timeout=30) as resp:
            events = list(parse_sse(resp.iter_lines()))
    assert events[-1][1] == "error" and events[-1][2]["code"] == "reply_stream_gap"
    assert "expected seq 1, got 2" in events[-1][2]["message"]


def test_a_job_that_expires_mid_read_ends_the_stream_with_an_error(redis_url, r):
    job = job_with(r, StartedEvent(attempt=1, seq=0), DeltaEvent(attempt=1, seq=1, text="a"))
    with running_gateway(redis_url) as url:
        with httpx.stream("GET", f"{url}/v1/jobs/{job}/events", timeout=60) as resp:
            events = []
            for ev in parse_sse(resp.iter_lines()):
                events.append(ev)
                if ev[1] == "delta":
                    r.delete(keys.reply(job), keys.job_info(job))  # its TTL ran out
    assert [e[1] for e in events] == ["started", "delta", "error"]
    assert events[-1][2]["code"] == "job_expired"


def test_a_last_event_id_after_the_stream_is_400(redis_url, r):
    job = job_with(r, StartedEvent(attempt=1, seq=0), DeltaEvent(attempt=1, seq=1, text="a"))
    with running_gateway(redis_url) as url:
        resp = httpx.get(f"{url}/v1/jobs/{job}/events", headers={"Last-Event-ID": "99999999999999-0"}, timeout=10)
    assert resp.status_code == 400 and "after this job's last event" in resp.json()["error"]["message"]


def test_an_openai_stream_never_splices_a_diverging_attempt(redis_url, r):
    """A redelivered job whose new attempt regenerates different text: the OpenAI
    stream ends with a `reply_diverged` error chunk (and the metric counts it)
    instead of sending the new attempt's text after the old one's."""
    import json
    import time

    r.zadd(keys.workers("m"), {"a-worker": time.time()})  # a live worker's heartbeat: the job is admitted
    with running_gateway(redis_url, models="m") as url:
        with httpx.stream("POST", f"{url}/v1/completions", timeout=60,
                          json={"model": "m", "prompt": "Once", "max_tokens": 8, "stream": True}) as resp:
            job = resp.headers["x-inferq-job-id"]
            for ev in (StartedEvent(attempt=1, seq=0), DeltaEvent(attempt=1, seq=1, text=" upon a", token_ids=[1, 2]),
                       RestartedEvent(attempt=2, seq=0, reason="redelivered"), StartedEvent(attempt=2, seq=1),
                       DeltaEvent(attempt=2, seq=2, text=" there was", token_ids=[3, 4]),
                       DoneEvent(attempt=2, seq=3, finish_reason="length")):
                r.xadd(keys.reply(job), encode_event(ev))
            bodies = [json.loads(line[6:]) for line in resp.iter_lines()
                      if line.startswith("data: ") and line != "data: [DONE]"]
        metrics = httpx.get(f"{url}/metrics", timeout=10).text
    texts = "".join(c["choices"][0]["text"] for c in bodies if c.get("choices"))
    assert texts == " upon a"  # what attempt 1 showed, and nothing of attempt 2
    assert bodies[-1]["error"]["code"] == "reply_diverged"
    assert "inferq_gateway_stream_divergences_total 1.0" in metrics
