"""The native jobs API over raw HTTP: submit, status/result, resumable SSE
events (Last-Event-ID), cancel; plus /health and /metrics."""
import json
import time

import httpx
import redis

from inferq.schemas import keys
from tests.gateway.stack import TINY


def parse_sse(lines):
    """Yield (id, event, data) for each SSE event in an iterator of lines."""
    ev = {}
    for line in lines:
        if line == "":
            if "data" in ev:
                yield ev.get("id"), ev.get("event"), json.loads(ev["data"])
            ev = {}
        elif line.startswith(":"):
            continue
        else:
            field, _, value = line.partition(":")
            ev[field] = value[1:] if value.startswith(" ") else value


def submit(url, **body):
    payload = {"model": TINY, "prompt": "The worker", "sampling": {"max_tokens": 12, "temperature": 0}, **body}
    r = httpx.post(f"{url}/v1/jobs", json=payload, timeout=30)
    assert r.status_code == 202, r.text
    return r.json()


def wait_done(url, job_id, timeout=60):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        body = httpx.get(f"{url}/v1/jobs/{job_id}", timeout=10).json()
        if body["status"] in ("done", "error", "cancelled"):
            return body
        time.sleep(0.1)
    raise AssertionError(f"job {job_id} did not finish")


def test_submit_returns_at_once_then_result(gateway_url):
    t0 = time.monotonic()
    created = submit(gateway_url, sampling={"max_tokens": 10, "temperature": 0, "ignore_eos": True})
    assert created["status"] == "queued" and created["id"] and created["model"] == TINY
    assert created["events_url"] == f"/v1/jobs/{created['id']}/events"
    assert time.monotonic() - t0 < 5
    body = wait_done(gateway_url, created["id"])
    assert body["status"] == "done"
    assert body["finish_reason"] == "length"
    assert len(body["token_ids"]) == 10 == body["usage"]["completion_tokens"]
    assert body["text"]
    assert body["timings"]["total"] > 0


def test_idempotency_key_returns_the_same_job(gateway_url):
    a = submit(gateway_url, idempotency_key="order-42-summary")
    b = submit(gateway_url, idempotency_key="order-42-summary")
    assert a["id"] == b["id"] and b["duplicate"] is True and a["duplicate"] is False


def test_events_stream_and_resume_with_last_event_id(gateway_url, stack):
    job = submit(gateway_url, sampling={"max_tokens": 24, "temperature": 0, "ignore_eos": True})["id"]
    first = []
    with httpx.stream("GET", f"{gateway_url}/v1/jobs/{job}/events", timeout=60) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        for eid, name, data in parse_sse(r.iter_lines()):
            first.append((eid, name, data))
            if name == "delta" and len(first) >= 4:
                break  # drop the connection mid-job
    last_id = first[-1][0]
    rest = []
    with httpx.stream("GET", f"{gateway_url}/v1/jobs/{job}/events", headers={"Last-Event-ID": last_id},
                      timeout=60) as r:
        for eid, name, data in parse_sse(r.iter_lines()):
            rest.append((eid, name, data))
    ids = [e[0] for e in first + rest]
    all_ids = [i.decode() for i, _ in redis.Redis.from_url(stack.url).xrange(keys.reply(job))]
    assert ids == all_ids  # nothing missed, nothing repeated
    assert rest[-1][1] == "done" and rest[-1][2]["finish_reason"] == "length"
    streamed_text = "".join(d["text"] for _, name, d in first + rest if name == "delta")
    assert streamed_text == httpx.get(f"{gateway_url}/v1/jobs/{job}", timeout=10).json()["text"]
    # Resuming after the terminal event ends at once with nothing new.
    with httpx.stream("GET", f"{gateway_url}/v1/jobs/{job}/events", headers={"Last-Event-ID": ids[-1]},
                      timeout=10) as r:
        assert list(parse_sse(r.iter_lines())) == []


def test_bad_last_event_id_is_400(gateway_url):
    job = submit(gateway_url)["id"]
    r = httpx.get(f"{gateway_url}/v1/jobs/{job}/events", headers={"Last-Event-ID": "garbage"}, timeout=10)
    assert r.status_code == 400 and "Last-Event-ID" in r.json()["error"]["message"]


def test_delete_cancels_a_running_job(gateway_url):
    job = submit(gateway_url, sampling={"max_tokens": 3000, "ignore_eos": True})["id"]
    with httpx.stream("GET", f"{gateway_url}/v1/jobs/{job}/events", timeout=60) as r:
        for _, name, _ in parse_sse(r.iter_lines()):
            if name == "delta":
                break
    r = httpx.delete(f"{gateway_url}/v1/jobs/{job}", timeout=10)
    assert r.status_code == 200 and r.json()["cancel_requested"] is True
    body = wait_done(gateway_url, job)
    assert body["status"] == "cancelled"
    assert body["finish_reason"] == "abort"
    assert len(body["token_ids"]) < 3000


def test_invalid_job_bodies_are_400(gateway_url):
    cases = [
        {"model": TINY, "sampling": {"max_tokens": 4}},                        # no prompt
        {"model": TINY, "prompt": "a", "messages": [{"role": "user", "content": "b"}]},  # two prompts
        {"model": TINY, "prompt": "a", "sampling": {"temperature": -1}},
        {"model": TINY, "prompt": "a", "surprise": 1},                           # unknown field
        {"model": TINY, "prompt": "a", "sampling": {"max_tokens": 10**6}},     # over the cap
    ]
    for body in cases:
        r = httpx.post(f"{gateway_url}/v1/jobs", json=body, timeout=10)
        assert r.status_code == 400, (body, r.text)
        assert r.json()["error"]["message"]


def test_health_and_metrics(gateway_url):
    health = httpx.get(f"{gateway_url}/health", timeout=10).json()
    assert health["status"] == "ok" and health["redis"] is True
    assert health["models"][TINY]["live_workers"] >= 1
    text = httpx.get(f"{gateway_url}/metrics", timeout=10).text
    assert f'inferq_workers_alive{{model="{TINY}"}} 1.0' in text
    assert f'inferq_queue_depth{{model="{TINY}"}}' in text
    assert 'inferq_gateway_requests_total{method="GET",route="/health",status="200"}' in text
