"""A client that drops a streaming OpenAI request cancels its job: the worker
stops generating (finish reason abort) long before max_tokens."""
import time

import httpx
import redis

from schemas import decode_event, keys
from tests.gateway.stack import TINY


def finished_event(redis_url, job_id, timeout=60):
    r = redis.Redis.from_url(redis_url)
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        for _, fields in r.xrange(keys.reply(job_id)):
            ev = decode_event(fields)
            if ev.type in ("done", "error"):
                return ev
        time.sleep(0.1)
    raise AssertionError("job never finished")


def test_disconnect_during_stream_cancels_the_job(gateway_url, stack):
    body = {"model": TINY, "messages": [{"role": "user", "content": "go on forever"}], "stream": True,
            "max_tokens": 3000, "ignore_eos": True}
    with httpx.stream("POST", f"{gateway_url}/v1/chat/completions", json=body, timeout=60) as resp:
        assert resp.status_code == 200
        job_id = resp.headers["x-inferq-job-id"]
        content_chunks = 0
        for line in resp.iter_lines():
            if line.startswith("data: ") and '"content":"' in line and '"content":""' not in line:
                content_chunks += 1
                if content_chunks >= 3:
                    break
    # The connection is closed here, mid-generation.
    ev = finished_event(stack.url, job_id)
    assert ev.type == "done" and ev.finish_reason == "abort"
    assert ev.usage.completion_tokens < 3000
    info = redis.Redis.from_url(stack.url).hgetall(keys.job_info(job_id))
    assert info[b"status"] == b"cancelled"
    metrics = httpx.get(f"{gateway_url}/metrics", timeout=10).text
    assert "inferq_gateway_cancelled_total 1.0" in metrics or "inferq_gateway_cancelled_total 2.0" in metrics


def test_disconnect_while_waiting_for_a_non_streamed_result_cancels(gateway_url, stack):
    r = redis.Redis.from_url(stack.url)
    before = {k for k in r.scan_iter(match="inferq:job:*")}
    body = {"model": TINY, "prompt": "go on", "max_tokens": 3000, "ignore_eos": True}
    try:
        httpx.post(f"{gateway_url}/v1/completions", json=body, timeout=httpx.Timeout(30, read=2.0))
        raise AssertionError("a 3000-token job should not finish in 2 s")
    except httpx.ReadTimeout:
        pass  # the client gives up and closes the connection
    (new_key,) = {k for k in r.scan_iter(match="inferq:job:*")} - before
    job_id = keys.name_of(new_key.decode())
    ev = finished_event(stack.url, job_id)
    assert ev.finish_reason == "abort" and ev.usage.completion_tokens < 3000
