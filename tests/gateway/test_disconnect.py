"""A client that drops a streaming OpenAI request cancels its job: the worker
stops generating (finish reason abort) long before max_tokens."""
import time

import httpx
import redis

from inferq.schemas import decode_event, keys
from tests.gateway.stack import TINY
from tests.service.conftest import wait_for


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
    """The client sends a non-streamed request over a raw socket, waits until its
    job is generating (observed in Redis, not assumed from a timeout), then hangs up."""
    import json
    import socket
    from urllib.parse import urlparse

    r = redis.Redis.from_url(stack.url)
    before = set(r.scan_iter(match="inferq:job:*"))
    body = json.dumps({"model": TINY, "prompt": "go on", "max_tokens": 3000, "ignore_eos": True}).encode()
    u = urlparse(gateway_url)
    sock = socket.create_connection((u.hostname, u.port), timeout=30)
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    def generating_job():
        new = set(r.scan_iter(match="inferq:job:*")) - before
        job = keys.name_of(next(iter(new)).decode()) if new else None
        return job if job and any(f.get(b"type") == b"delta" for _, f in r.xrange(keys.reply(job))) else None

    job_id = wait_for(generating_job, 60, interval=0.02, what="the job generating")
    sock.close()  # the client is gone mid-generation
    ev = finished_event(stack.url, job_id)
    assert ev.finish_reason == "abort" and ev.usage.completion_tokens < 3000
