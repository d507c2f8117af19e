"""Background responses through the official `openai` client against real processes.

- create(background=True) answers at once with status "queued"; polling sees it end;
- cancel ends a running background response (the job's own cancel path);
- a background response survives a SIGKILLed worker and a SIGKILLed gateway: a new
  gateway process reports it, the job is redelivered to a new worker (which continues
  it), and its event stream resumed there with ``starting_after`` continues the first
  gateway's numbering with no gap and no repeat.
"""
from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request

import pytest
import redis
from openai import OpenAI

from inferq.schemas import decode_event, keys
from tests.conftest import free_port
from tests.gateway.stack import TINY
from tests.workers import REPO, WorkerProc

FINAL = ("completed", "incomplete", "failed", "cancelled")


def wait_for(cond, timeout: float, what: str):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        value = cond()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture(scope="module")
def client(gateway_url):
    return OpenAI(base_url=f"{gateway_url}/v1", api_key="unused", max_retries=0, timeout=120)


def test_background_returns_queued_then_completes(client):
    r = client.responses.create(model=TINY, input="Write a poem", background=True, max_output_tokens=16,
                                temperature=0)
    assert r.background is True and r.status == "queued" and r.output == []
    done = wait_for(lambda: (x := client.responses.retrieve(r.id)).status in FINAL and x, 120, "the response to end")
    assert done.status in ("completed", "incomplete") and done.output_text
    assert done.usage.output_tokens <= 16
    # The same as a foreground request (greedy).
    assert client.responses.create(model=TINY, input="Write a poem", max_output_tokens=16,
                                   temperature=0).output_text == done.output_text


def test_an_ended_response_is_saved_before_its_reply_stream_expires(client, stack):
    r = client.responses.create(model=TINY, input="Save me", background=True, max_output_tokens=8, temperature=0)
    job_id = r.id.removeprefix("resp_")
    r_ = redis.Redis.from_url(stack.url)
    try:
        # Nobody asks for it: the gateway saves its final object on its own.
        wait_for(lambda: r_.hexists(keys.response(job_id), "final"), 120, "the final object to be saved")
        r_.delete(keys.reply(job_id), keys.job_info(job_id))  # what reply_ttl does later
    finally:
        r_.close()
    kept = client.responses.retrieve(r.id)
    assert kept.status in ("completed", "incomplete") and kept.output_text
    assert kept.output_text == client.responses.create(model=TINY, input="Save me", max_output_tokens=8,
                                                       temperature=0).output_text


def test_background_cancel(client, stack):
    r = client.responses.create(model=TINY, input="Go on and on", background=True, max_output_tokens=4000,
                                temperature=0.8, extra_body={"ignore_eos": True})
    wait_for(lambda: client.responses.retrieve(r.id).status == "in_progress", 60, "the job to start")
    cancelled = client.responses.cancel(r.id)
    assert cancelled.status == "cancelled"
    later = wait_for(lambda: (x := client.responses.retrieve(r.id)).usage and x, 60, "the job's end")
    assert later.status == "cancelled" and later.usage.output_tokens < 4000
    r_ = redis.Redis.from_url(stack.url)
    try:
        assert r_.hget(keys.job_info(r.id.removeprefix("resp_")), "status") == b"cancelled"
    finally:
        r_.close()
    # A foreground response cannot be cancelled (as OpenAI has it).
    plain = client.responses.create(model=TINY, input="x", max_output_tokens=2)
    with pytest.raises(Exception) as e:
        client.responses.cancel(plain.id)
    assert getattr(e.value, "status_code", None) == 400


class GatewayProc:
    """``python -m inferq.producer.gateway`` as its own process."""

    def __init__(self, redis_url: str, log_dir):
        self.port = free_port()
        env = dict(os.environ, INFERQ_REDIS_URL=redis_url, PYTHONPATH=str(REPO))
        self.log = open(log_dir / f"gateway-{self.port}.log", "wb")
        self.proc = subprocess.Popen([sys.executable, "-m", "inferq.producer.gateway", "--host", "127.0.0.1",
                                      "--port", str(self.port), "--log-level", "warning"],
                                     cwd=REPO, env=env, stdout=self.log, stderr=subprocess.STDOUT)
        self.url = f"http://127.0.0.1:{self.port}"

        def up():
            try:
                return urllib.request.urlopen(f"{self.url}/health", timeout=2).status == 200
            except OSError:
                assert self.proc.poll() is None, "the gateway exited"
                return False
        wait_for(up, 60, "the gateway to serve")

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self.log.close()


@pytest.mark.slow
def test_background_response_survives_a_killed_worker_and_gateway(stack, tmp_path):
    model = "resp-bg"
    # Two workers started together (a start costs seconds); the one that takes the job
    # is killed, the other takes it over. Paced so the kill lands mid-generation.
    workers = {name: WorkerProc(stack.url, stack.model_dir, model, tmp_path, name, "--device", "cpu",
                                "--step-pace-s", "0.05") for name in ("resp-bg-1", "resp-bg-2")}
    gw_a = gw_b = None
    r = redis.Redis.from_url(stack.url)
    try:
        for w in workers.values():
            w.wait_ready(480)  # generous: two workers load at once, on a machine that may be busy
        gw_a = GatewayProc(stack.url, tmp_path)
        client_a = OpenAI(base_url=f"{gw_a.url}/v1", api_key="unused", max_retries=0, timeout=120)
        stream = client_a.responses.create(model=model, input="Tell me everything", background=True, stream=True,
                                           max_output_tokens=80, temperature=0.9, extra_body={"ignore_eos": True})
        seen = []
        for ev in stream:
            seen.append(ev)
            if sum(e.type == "response.output_text.delta" for e in seen) >= 6:
                break
        stream.close()
        resp_id = seen[0].response.id
        assert [e.type for e in seen[:3]] == ["response.created", "response.queued", "response.in_progress"]
        assert seen[0].response.status == "queued"
        job_id = resp_id.removeprefix("resp_")
        holder = r.hget(keys.job_info(job_id), "worker").decode()
        workers[holder].kill()
        gw_a.kill()

        gw_b = GatewayProc(stack.url, tmp_path)
        client_b = OpenAI(base_url=f"{gw_b.url}/v1", api_key="unused", max_retries=0, timeout=120)
        assert client_b.responses.retrieve(resp_id).status == "in_progress"  # from the job's records alone
        final = wait_for(lambda: (x := client_b.responses.retrieve(resp_id)).status in FINAL and x, 120,
                         "the response to end")
        assert final.status == "incomplete" and final.usage.output_tokens == 80, final.status

        # The job was redelivered and continued (request migration), not started over.
        events = [decode_event(f) for _, f in r.xrange(keys.reply(job_id))]
        [restarted] = [e for e in events if e.type == "restarted"]
        assert restarted.resume and restarted.resume[0].tokens > 0

        # Resumed after the last event gateway A sent: no gap, no repeat.
        last = seen[-1].sequence_number
        rest = list(client_b.responses.retrieve(resp_id, stream=True, starting_after=last))
        assert [e.sequence_number for e in rest] == list(range(last + 1, last + 1 + len(rest)))
        assert rest[-1].type == f"response.{final.status}"
        text = "".join(e.delta for e in seen + rest if e.type == "response.output_text.delta")
        assert text == final.output_text == rest[-1].response.output_text
        # The whole stream, read again from another process, is the same events.
        whole = list(client_b.responses.retrieve(resp_id, stream=True))
        assert [e.model_dump() for e in whole] == [e.model_dump() for e in seen + rest]
    finally:
        for p in (gw_a, gw_b):
            if p is not None:
                p.kill()
        for w in workers.values():
            w.terminate(timeout=20)
        r.close()
