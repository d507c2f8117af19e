"""Producer → Redis → worker process → reply streams, against a real
redis-server and a real worker subprocess serving a tiny random Llama."""
from __future__ import annotations

import asyncio
import json
import time

import pytest
import redis

from inferq.producer import AsyncProducer, JobFailed
from inferq.schemas import Job, SamplingParams, keys

from tests.service.conftest import module_producer, paced_worker, wait_for

MODEL = "tiny-e2e"


@pytest.fixture(scope="module")
def worker(module_redis, tiny_model, tmp_path_factory):
    yield from paced_worker(module_redis, tiny_model, tmp_path_factory, MODEL, "e2e-1")


@pytest.fixture
def p(module_redis):
    yield from module_producer(module_redis, MODEL)


@pytest.fixture
def r(module_redis):
    c = redis.Redis.from_url(module_redis.url)
    yield c
    c.close()


def _requests():
    """50 greedy requests of mixed shapes: text, token ids, chat messages."""
    reqs = []
    for i in range(50):
        params = {"max_tokens": 4 + (i * 7) % 17, "temperature": 0.0, "ignore_eos": i % 3 == 0}
        if i % 10 == 3:
            reqs.append(({"messages": [{"role": "system", "content": "Be brief."},
                                       {"role": "user", "content": f"Question number {i}?"}]}, params))
        elif i % 10 == 7:
            reqs.append(({"prompt_token_ids": [1 + (i * 37 + k * 11) % 4000 for k in range(3 + i % 9)]}, params))
        else:
            reqs.append(({"prompt": f"Job {i}: " + "the quick brown fox " * (i % 6)}, params))
    return reqs


def _offline(llm, reqs):
    prompts = []
    for kind, _ in reqs:
        if "messages" in kind:
            prompts.append(llm.apply_chat_template(kind["messages"]))
        else:
            prompts.append(kind.get("prompt") or kind.get("prompt_token_ids"))
    return llm.generate(prompts, [SamplingParams(**params) for _, params in reqs])


def test_50_concurrent_jobs_equal_offline_greedy(worker, module_redis, offline_llm):
    reqs = _requests()
    expected = _offline(offline_llm, reqs)

    async def one(ap, kind, params):
        h = await ap.submit(**kind, sampling=params)
        pieces = [t async for t in h.text(timeout=240)]
        types, seqs = [], []
        async for _, ev in h.stream(timeout=30):
            types.append(ev.type)
            seqs.append((ev.attempt, ev.seq))
        res = await h.result(timeout=30)
        return "".join(pieces), res, types, seqs

    async def main():
        async with AsyncProducer(module_redis.url, default_model=MODEL) as ap:
            return await asyncio.gather(*(one(ap, k, prm) for k, prm in reqs))

    t0 = time.time()
    got = asyncio.run(main())
    assert time.time() - t0 < 240
    for i, ((streamed, res, types, seqs), exp) in enumerate(zip(got, expected)):
        assert res.token_ids == exp.token_ids, f"job {i}"
        assert res.text == exp.text and streamed == exp.text, f"job {i}"
        assert res.finish_reason == exp.finish_reason
        assert res.usage.completion_tokens == len(exp.token_ids)
        assert res.usage.prompt_tokens == len(exp.prompt_token_ids)
        assert types[0] == "queued" and types[1] == "started" and types[-1] == "done"
        assert seqs[1:] == [(1, k) for k in range(len(seqs) - 1)]  # attempt 1, seq 0.. without gaps
        assert res.timings.ttft is not None and 0 <= res.timings.queue <= res.timings.ttft <= res.timings.total
    r = redis.Redis.from_url(module_redis.url)
    assert r.xlen(keys.jobs(MODEL)) == 0  # acked and deleted
    assert r.xpending(keys.jobs(MODEL), keys.JOBS_GROUP)["pending"] == 0
    assert r.ttl(keys.reply(got[0][1].job_id)) > 0  # reply streams expire after done
    # The worker's metrics saw all of it, under vLLM-style names.
    assert worker.metric("inferq:time_to_first_token_seconds_count") >= 50
    assert worker.metric("inferq:e2e_request_latency_seconds_count") >= 50
    assert worker.metric("inferq:request_success_total", finished_reason="length") >= sum(
        1 for e in expected if e.finish_reason == "length")
    assert worker.metric("inferq:generation_tokens_total") >= sum(len(e.token_ids) for e in expected)
    assert worker.metric("inferq:engine_invariant_failures_total") == 0
    r.close()


def _long(max_tokens=400):
    return {"max_tokens": max_tokens, "temperature": 0.0, "ignore_eos": True}


def test_cancel_mid_generation_frees_blocks(worker, p, r):
    h = p.submit("cancel me", sampling=_long())
    it = h.stream(timeout=60)
    for _, ev in it:
        if ev.type == "delta":
            break
    assert h.cancel() is True
    res = h.result(timeout=30)
    assert res.finish_reason == "abort"
    assert 0 < res.usage.completion_tokens < 400
    st = h.status()
    assert st["status"] == "cancelled" and st["finish_reason"] == "abort"
    assert not r.exists(keys.cancel(h.id))
    wait_for(lambda: worker.metric("inferq:num_requests_running") == 0, 10, what="engine idle")
    assert worker.metric("inferq:kv_cache_usage_perc") == 0.0  # every block came back
    assert worker.metric("inferq:engine_invariant_failures_total") == 0


def test_deadline_mid_generation_and_before_prefill(worker, p, r):
    h = p.submit("deadline", sampling=_long(), deadline=time.time() + 1.0)
    res = h.result(timeout=30)
    assert res.finish_reason == "deadline"
    assert 0 < res.usage.completion_tokens < 400
    assert res.timings.total < 10
    # A job that is already late when a worker reads it never reaches prefill.
    job = Job(model=MODEL, prompt="late", deadline=time.time() - 5)
    r.xadd(keys.jobs(MODEL), job.to_fields())
    late = p.job(job.id)
    wait_for(lambda: r.exists(keys.reply(job.id)), 10, what="reply stream")
    res = late.result(timeout=30)
    assert res.finish_reason == "deadline" and res.usage.completion_tokens == 0
    wait_for(lambda: worker.metric("inferq:num_requests_running") == 0, 10, what="engine idle")
    assert worker.metric("inferq:kv_cache_usage_perc") == 0.0
    assert worker.metric("inferq:engine_invariant_failures_total") == 0


def test_cancel_before_start_never_runs(worker, p, r):
    job = Job(model=MODEL, prompt="never", sampling=SamplingParams(max_tokens=50))
    r.set(keys.cancel(job.id), "1")
    r.xadd(keys.jobs(MODEL), job.to_fields())
    wait_for(lambda: r.exists(keys.reply(job.id)), 10, what="reply stream")
    res = p.job(job.id).result(timeout=30)
    assert res.finish_reason == "abort" and res.usage.completion_tokens == 0
    assert p.job(job.id).status()["status"] == "cancelled"


def _j(**kw) -> str:
    return json.dumps({"model": MODEL, **kw})


BAD = [
    # (raw job field, job id a client would wait on (None: unreadable), error code, words in the reason)
    ("not json", None, "invalid_job", "invalid job"),
    (_j(id="bad-unknown-field", prompt="x", colour="red"), "bad-unknown-field", "invalid_job", "colour"),
    (_j(id="bad-sampling", prompt="x", sampling={"top_p": 0}), "bad-sampling", "invalid_job", "top_p"),
    (_j(id="bad-nothing", sampling={}), "bad-nothing", "invalid_job", "exactly one of"),
    (json.dumps({"id": "bad-model", "model": "other-model", "prompt": "x"}), "bad-model", "unknown_model", "other-model"),
    (_j(id="bad-long", prompt_token_ids=[5] * 600), "bad-long", "prompt_too_long", "600 tokens"),
    (_j(id="bad-vocab", prompt_token_ids=[10**6]), "bad-vocab", "invalid_prompt", "vocabulary"),
    (b'{"id": "bad-utf8", "model": "' + MODEL.encode() + b'", "prompt": "\xff\xfe"}', "bad-utf8", "invalid_job", "invalid job"),
]


def test_bad_input_gets_error_event_dlq_entry_and_ack(worker, p, r):
    dlq_before = r.xlen(keys.dlq(MODEL))
    for raw, _, _, _ in BAD:
        r.xadd(keys.jobs(MODEL), {"job": raw})
    r.xadd(keys.jobs(MODEL), {"something": "else"})
    ok = p.submit("still alive", sampling={"max_tokens": 3, "temperature": 0})
    assert ok.result(timeout=60).usage.completion_tokens == 3  # the worker survived all of it
    wait_for(lambda: r.xlen(keys.dlq(MODEL)) - dlq_before == len(BAD) + 1, 20, what="dlq entries")
    entries = [e[1] for e in r.xrange(keys.dlq(MODEL))[dlq_before:]]
    assert sorted(e[b"code"].decode() for e in entries) == sorted([c for _, _, c, _ in BAD] + ["invalid_job"])
    by_id = {e[b"job_id"].decode(): e for e in entries}
    for raw, jid, code, words in BAD:
        if jid is None:
            continue
        entry = by_id[jid]
        assert entry[b"code"].decode() == code and words in entry[b"reason"].decode(), entry
        assert entry[b"job"] == (raw if isinstance(raw, bytes) else raw.encode())  # copied verbatim
        with pytest.raises(JobFailed) as e:
            p.job(jid).result(timeout=10)
        assert e.value.code == code and words in e.value.message
        assert p.job(jid).status()["status"] == "error"
    assert all(e[b"entry_id"] and e[b"failed_at"] for e in entries)
    assert r.xlen(keys.jobs(MODEL)) == 0
    assert r.xpending(keys.jobs(MODEL), keys.JOBS_GROUP)["pending"] == 0
    assert worker.proc.poll() is None
    wait_for(lambda: worker.metric("inferq:dlq_size") == r.xlen(keys.dlq(MODEL)), 10, what="dlq gauge")


def test_idempotent_submit_returns_the_finished_job(worker, p):
    a = p.submit("same", idempotency_key="req-42", sampling={"max_tokens": 4, "temperature": 0})
    first = a.result(timeout=60)
    b = p.submit("same", idempotency_key="req-42", sampling={"max_tokens": 4, "temperature": 0})
    assert b.id == a.id and b.duplicate
    assert b.result(timeout=5).text == first.text
    assert p.depth() == 0


def test_metrics_and_heartbeat(worker, p):
    names = {k.partition("{")[0] for k in worker.metrics()}
    for name in (
        "inferq:time_to_first_token_seconds_bucket", "inferq:inter_token_latency_seconds_bucket",
        "inferq:e2e_request_latency_seconds_bucket", "inferq:request_queue_time_seconds_bucket",
        "inferq:num_requests_running", "inferq:num_requests_waiting", "inferq:kv_cache_usage_perc",
        "inferq:prefix_cache_queries_total", "inferq:prefix_cache_hits_total", "inferq:num_preemptions_total",
        "inferq:dlq_size", "inferq:consumer_lag", "inferq:queue_depth", "inferq:worker_config_info",
    ):
        assert name in names, name
    cfg = [k for k in worker.metrics() if k.startswith("inferq:worker_config_info")][0]
    assert 'max_num_seqs="32"' in cfg and 'num_kv_blocks="512"' in cfg
    assert 'eos_token_ids="2"' in cfg  # SmolLM2: config, generation config and tokenizer agree on <|im_end|>
    assert "e2e-1" in p.workers()


def test_second_entry_with_a_running_job_id_is_dead_lettered_quietly(worker, p, r):
    job = Job(model=MODEL, prompt="only once", sampling=SamplingParams(max_tokens=60, temperature=0, ignore_eos=True))
    r.xadd(keys.jobs(MODEL), job.to_fields())
    r.xadd(keys.jobs(MODEL), job.to_fields())  # a client bug or a replay: same id twice
    # Written past the SDK, the job has no record until the worker takes it (the SDK would
    # say "not found" before that): wait for the worker, not for a guessed delay.
    wait_for(lambda: r.exists(keys.reply(job.id), keys.job_info(job.id)), 30, what="the worker taking the job")
    res = p.job(job.id).result(timeout=60)
    assert res.usage.completion_tokens == 60 and res.attempt == 1
    codes = [f[b"code"] for _, f in r.xrange(keys.dlq(MODEL)) if f[b"job"] == job.to_fields()["job"].encode()]
    assert codes == [b"duplicate_job_id"]
    assert r.xlen(keys.jobs(MODEL)) == 0


def test_hand_made_payload_with_nonsense_created_at_still_gets_sane_timings(worker, p, r):
    raw = '{"id": "nan-created", "model": "%s", "prompt": "x", "created_at": NaN, "sampling": {"max_tokens": 3}}' % MODEL
    r.xadd(keys.jobs(MODEL), {"job": raw})
    wait_for(lambda: r.exists(keys.reply("nan-created")), 10, what="reply stream")
    res = p.job("nan-created").result(timeout=60)
    assert res.usage.completion_tokens == 3
    t = res.timings
    assert all(v is not None and 0 <= v < 60 for v in (t.queue, t.ttft, t.total))


def test_prompt_logprobs_reach_the_sdk_result(worker, p, tiny_model):
    """SamplingParams.prompt_logprobs: the worker's engine computes them, the first
    delta carries them, the SDK result holds them; values equal HF's teacher-forced
    log-softmax within 2e-3 (fp32 both sides; see tests/engine/test_prompt_logprobs.py)."""
    import torch
    from transformers import AutoModelForCausalLM

    h = p.submit("Prompt logprobs travel with the first delta",
                 sampling={"max_tokens": 3, "temperature": 0.0, "prompt_logprobs": 2, "logprobs": 1})
    res = h.result(timeout=60)
    ids, lps = res.prompt_token_ids, res.prompt_logprobs
    assert ids and len(lps) == len(ids) == res.usage.prompt_tokens and lps[0] is None
    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32).eval()
    with torch.inference_mode():
        ref = torch.log_softmax(model(torch.tensor([ids])).logits[0].float(), -1)
    for j in range(1, len(ids)):
        assert 2 <= len(lps[j]) <= 3 and ids[j] in lps[j]
        assert lps[j][ids[j]] == pytest.approx(float(ref[j - 1, ids[j]]), abs=2e-3)
    assert len(res.logprobs) == len(res.token_ids)
    plain = p.submit("no prompt logprobs", sampling={"max_tokens": 2, "temperature": 0.0}).result(timeout=60)
    assert plain.prompt_logprobs is None and plain.prompt_token_ids is None
