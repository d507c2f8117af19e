"""Fencing: a worker that lost its lease can never finish the live attempt.

Worker A reaches Redis through a TCP proxy that stops forwarding while A's jobs
run; worker B reclaims them and starts attempt 2; A finishes its attempt-1 work
during the stall and, when the link comes back, sends its prepared finishes.
Every one is refused by Redis (and counted), so each job ends with exactly one
final event, from the live attempt (never attempt 1), and every reader returns it: the sync SDK,
the gateway non-streamed, and the gateway streamed. Also: one worker id can be
used by one live process only."""
from __future__ import annotations

import json
import threading

import httpx
import pytest
import redis

from inferq.producer import Producer
from inferq.schemas import SamplingParams, decode_event, keys
from inferq.schemas.fold import Assembly
from tests.conftest import RedisServer
from tests.gateway.stack import running_gateway
from tests.reliability.conftest import pending_count
from tests.reliability.tcp_proxy import StallingProxy
from tests.service.conftest import WorkerProc, offline_llm, wait_for  # noqa: F401  (offline_llm is a fixture)

MODEL = "tiny-fence"
TOKENS = 40
PACE = ("--step-pace-s", "0.05")  # 40 paced steps: >= 2 s per attempt on any machine


def greedy() -> dict:
    return {"max_tokens": TOKENS, "temperature": 0.0, "ignore_eos": True}


@pytest.fixture
def server(tmp_path):
    (tmp_path / "redis").mkdir()
    s = RedisServer(tmp_path / "redis").start()
    yield s
    s.stop()


def job_ids(r: redis.Redis) -> list[str]:
    return [json.loads(f[b"job"])["id"] for _, f in r.xrange(keys.jobs(MODEL))]


def info(r: redis.Redis, job_id: str) -> dict:
    return {k.decode(): v.decode() for k, v in r.hgetall(keys.job_info(job_id)).items()}


def test_partitioned_worker_cannot_finish_the_live_attempt(server, tiny_model, offline_llm, tmp_path):
    r = redis.Redis.from_url(server.url)
    proxy = StallingProxy(server.port)
    a = WorkerProc(proxy.url(), tiny_model, MODEL, tmp_path, "part-a", *PACE, metrics=True).wait_ready()
    b = None
    p = Producer(server.url, default_model=MODEL)
    try:
        with running_gateway(server.url, producer={"default_model": MODEL}) as gw:
            prompts = [f"partition job {i}" for i in range(13)]
            handles = [p.submit(t, sampling=greedy()) for t in prompts[:10]]
            got: dict[str, object] = {}

            def non_streamed():
                got["plain"] = httpx.post(f"{gw}/v1/completions", json={"model": MODEL, "prompt": prompts[10],
                                          "max_tokens": TOKENS, "temperature": 0, "ignore_eos": True}, timeout=240)

            def streamed():
                with httpx.stream("POST", f"{gw}/v1/completions", timeout=240,
                                  json={"model": MODEL, "prompt": prompts[11], "max_tokens": TOKENS,
                                        "temperature": 0, "ignore_eos": True, "stream": True}) as resp:
                    got["stream"] = [line for line in resp.iter_lines() if line.startswith("data: ")]

            def sampled():  # sampled, no seed: the job's seed is fixed at admission
                with httpx.stream("POST", f"{gw}/v1/completions", timeout=240,
                                  json={"model": MODEL, "prompt": prompts[12], "max_tokens": TOKENS,
                                        "temperature": 0.9, "ignore_eos": True, "stream": True}) as resp:
                    got["sampled_id"] = resp.headers["x-inferq-job-id"]
                    got["sampled"] = [line for line in resp.iter_lines() if line.startswith("data: ")]

            threads = [threading.Thread(target=non_streamed), threading.Thread(target=streamed),
                       threading.Thread(target=sampled)]
            for t in threads:
                t.start()
            wait_for(lambda: r.xlen(keys.jobs(MODEL)) == 13, 60, what="13 jobs queued")
            ids = job_ids(r)
            wait_for(lambda: all(info(r, j).get("status") == "running" and info(r, j).get("worker") == "part-a"
                                 for j in ids), 60, what="A running all 13")

            # The sampled stream has shown text from attempt 1 before the partition.
            wait_for(lambda: "sampled_id" in got and sum(
                1 for _, f in r.xrange(keys.reply(got["sampled_id"])) if f[b"type"] == b"delta") >= 3,
                60, what="the sampled job streaming")
            proxy.pause()  # A's link to Redis stalls: its lease renewals and replies are held
            b = WorkerProc(server.url, tiny_model, MODEL, tmp_path, "part-b", "--step-pace-s", "0.1",
                           metrics=True).wait_ready()
            # B's reaper claims the idle entries (3 leases of 1 s) and starts attempt 2 of each.
            wait_for(lambda: all(info(r, j).get("worker") == "part-b" and info(r, j).get("attempt") == "2"
                                 for j in ids), 90, what="B running attempt 2 of all 13")
            # A's engine kept running through the stall (only Redis is cut off), so its
            # attempt-1 finishes are queued behind the stalled link; B, paced slower,
            # is still generating attempt 2 when they arrive.
            proxy.resume()

            expected = {t: e.text for t, e in zip(prompts, offline_llm.generate(prompts, SamplingParams(**greedy())))}
            for h, prompt in zip(handles, prompts):
                res = h.result(timeout=120)
                assert res.finish_reason == "length" and res.usage.completion_tokens == TOKENS
                assert res.text == expected[prompt]
            for t in threads:
                t.join(240)
        plain = got["plain"]
        assert plain.status_code == 200, plain.text
        choice = plain.json()["choices"][0]
        assert choice["finish_reason"] == "length" and choice["text"] == expected[prompts[10]]
        chunks = [json.loads(line[6:]) for line in got["stream"] if line != "data: [DONE]"]
        assert "".join(c["choices"][0]["text"] for c in chunks if c.get("choices")) == expected[prompts[11]]
        assert [c["choices"][0]["finish_reason"] for c in chunks if c.get("choices")][-1] == "length"
        # The sampled stream, taken over mid-generation while A's late attempt-1 deltas
        # arrive: what it showed is the job's final text, which continued attempt 1.
        sampled_chunks = [json.loads(line[6:]) for line in got["sampled"] if line != "data: [DONE]"]
        shown = "".join(c["choices"][0]["text"] for c in sampled_chunks if c.get("choices"))
        asm = Assembly()
        for _, f in r.xrange(keys.reply(got["sampled_id"])):
            asm.feed(decode_event(f))
        assert shown == asm.text and asm.finish_reason == "length" and len(asm.token_ids) == TOKENS
        restarted = [decode_event(f) for _, f in r.xrange(keys.reply(got["sampled_id"]))
                     if f[b"type"] == b"restarted"]
        assert restarted and restarted[0].resume, "the new attempt started over instead of continuing"

        # A's attempt-1 work ends either refused by Redis (counted) or dropped by its
        # lease keeper first (renewal reports the entries lost); never published.
        wait_for(lambda: a.metric("inferq:jobs_in_flight") == 0, 60, what="A letting go of its jobs")
        # Each job has exactly one final event, from the live attempt: attempt 2 on B.
        # A later attempt is fair too: a shared CI core that freezes B past three
        # leases (3 s) lets a reaper take the job again (CI saw attempt 3, on A once it
        # had recovered). What must never be published is A's attempt 1.
        later = 0
        for j in ids:
            events = [decode_event(f) for _, f in r.xrange(keys.reply(j))]
            finals = [e for e in events if e.type in ("done", "error")]
            st = info(r, j)
            assert [e.type for e in finals] == ["done"] and finals[0].attempt >= 2, (j, finals)
            assert st["status"] == "done" and st["attempt"] == str(finals[0].attempt), (j, finals, st)
            if finals[0].attempt == 2:
                assert st["worker"] == "part-b", st
            later += finals[0].attempt > 2
        assert r.xlen(keys.jobs(MODEL)) == 0 and pending_count(r, MODEL) == 0 and r.xlen(keys.dlq(MODEL)) == 0
        assert a.proc.poll() is None and b.proc.poll() is None  # nobody died of it
        refused = a.metric("inferq:fenced_refusals_total")
        print(f"\n[reliability] partition: 13 jobs, attempt 1 on the cut-off worker, attempt 2 on the other; "
              f"{refused:.0f} stale state changes refused; 13 single final events ({later} past attempt 2)")
    finally:
        proxy.resume()
        p.close()
        for w in (a, b):
            if w is not None:
                w.terminate(timeout=30)
        proxy.close()
        r.close()


def test_one_worker_id_one_live_process(server, tiny_model, tmp_path):
    first = WorkerProc(server.url, tiny_model, MODEL, tmp_path, "same-id", metrics=True).wait_ready()
    try:
        second = WorkerProc(server.url, tiny_model, MODEL, tmp_path, "same-id")
        assert second.proc.wait(120) == 2
        assert "is in use by another live worker process" in second.log()
        p = Producer(server.url, default_model=MODEL)
        assert p.submit("still served", sampling=greedy()).result(timeout=120).usage.completion_tokens == TOKENS
        p.close()
        # A predecessor killed without a goodbye is waited out, not taken for a live one.
        first.kill()
        third = WorkerProc(server.url, tiny_model, MODEL, tmp_path, "same-id")
        wait_for(lambda: "worker_started" in third.log() or third.proc.poll() is not None, 120,
                 what="the restarted worker")
        assert third.proc.poll() is None, third.log()[-2000:]
        third.terminate(timeout=30)
    finally:
        first.terminate(timeout=30)
