"""An open OpenAI stream survives its Redis connection being dropped: the
gateway reconnects and reads on from the last reply entry it saw."""
import json
import time

import httpx
import redis

from inferq.producer import Producer
from tests.gateway.stack import TINY


def kill_gateway_readers(r: redis.Redis) -> int:
    """Drop the connections blocked in XREAD (the gateway's reply readers; workers use XREADGROUP)."""
    killed = 0
    for c in r.client_list():
        if c.get("cmd") == "xread":
            killed += r.client_kill_filter(_id=c["id"])
    return killed


def test_stream_survives_a_dropped_redis_connection(gateway_url, stack):
    r = redis.Redis.from_url(stack.url)
    body = {"model": TINY, "prompt": "Count", "max_tokens": 150, "temperature": 0, "ignore_eos": True,
            "stream": True}
    text, killed, finish = [], 0, None
    with httpx.stream("POST", f"{gateway_url}/v1/completions", json=body, timeout=120) as resp:
        job_id = resp.headers["x-inferq-job-id"]
        for line in resp.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            assert "error" not in chunk, chunk
            text.append(chunk["choices"][0]["text"])
            finish = chunk["choices"][0]["finish_reason"] or finish
            if len(text) == 5:
                deadline = time.monotonic() + 5
                while not killed and time.monotonic() < deadline:
                    killed = kill_gateway_readers(r)
    assert killed >= 1
    assert finish == "length"
    assert "".join(text) == Producer(stack.url).job(job_id).result(timeout=10).text
