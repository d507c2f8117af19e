"""The completion record and its pieces against a real redis-server: the fenced
final-state scripts add it in the same step as the final state (only while a
dispatcher's stream exists, never when the change is refused); the record maps
to OpenAI's event types; the signature is the one the official SDK accepts;
the outbox never writes a delivery twice and never revives a settled one."""
from __future__ import annotations

import asyncio
import json
import time

import openai
import pytest
import redis
import redis.asyncio as aredis

from inferq.schemas import keys, records, transitions
from inferq.schemas.completion_events import EVENTS_GROUP, CompletionEvent, batch_record, event_id, job_record
from inferq.producer.gateway.webhooks.endpoints import check_events, check_secret, new_secret, parse_config
from inferq.producer.gateway.webhooks.outbox import Delivery, Outbox
from inferq.producer.gateway.webhooks.signer import signed_headers

G = keys.JOBS_GROUP
MODEL = "hooks"


@pytest.fixture
def r(redis_url):
    c = redis.Redis.from_url(redis_url, decode_responses=True)
    yield c
    c.close()


def events_stream(job_id: str) -> str:
    return keys.completion_events(keys.job_tag(job_id))


def open_stream(r, job_id: str) -> None:
    r.xgroup_create(events_stream(job_id), EVENTS_GROUP, id="0", mkstream=True)


def delivered(r, job_id: str, consumer: str = "w-a") -> str:
    stream = keys.jobs(MODEL)
    try:
        r.xgroup_create(stream, G, id="0", mkstream=True)
    except redis.ResponseError:
        pass
    eid = r.xadd(stream, {"job": json.dumps({"id": job_id, "tenant": "t1", "metadata": {"route": "responses"}})})
    r.xreadgroup(G, consumer, {stream: ">"}, count=1)
    return eid


def finish(r, eid: str, job_id: str, consumer: str = "w-a", attempt: int = 1):
    return transitions.finish(r, stream=keys.jobs(MODEL), entry_id=eid, consumer=consumer, attempt=attempt,
                              job_id=job_id, event={"type": "done", "data": "{}"},
                              fields={"status": "done", "worker": consumer, "finished_at": "1.0"},
                              ttl_after_done=60, reply_maxlen=100,
                              completion=job_record(job_id, "t1", "done", "length", "responses", at=123))


def claim(r, eid: str, job_id: str, consumer: str = "w-a"):
    return transitions.claim_attempt(r, stream=keys.jobs(MODEL), entry_id=eid, consumer=consumer, job_id=job_id,
                                     live_ttl=60)


def test_finish_adds_the_record_in_the_same_step_only_while_the_stream_exists(r):
    eid = delivered(r, "j1")
    claim(r, eid, "j1")
    assert finish(r, eid, "j1") == transitions.DONE
    assert r.exists(events_stream("j1")) == 0  # no dispatcher ever ran: nothing piles up

    open_stream(r, "j2")
    eid = delivered(r, "j2")
    claim(r, eid, "j2")
    assert finish(r, eid, "j2") == transitions.DONE
    [(_, fields)] = r.xrange(events_stream("j2"))
    assert fields == job_record("j2", "t1", "done", "length", "responses", at=123)
    # The same finish re-sent (a dropped connection): answered "already done", no second record.
    assert finish(r, eid, "j2") == transitions.ALREADY_DONE
    assert r.xlen(events_stream("j2")) == 1


def test_a_refused_finish_or_fail_adds_no_record(r):
    open_stream(r, "j3")
    eid = delivered(r, "j3", consumer="w-a")
    claim(r, eid, "j3", consumer="w-a")
    # w-b never owned the entry: refused, and the stream stays empty.
    assert finish(r, eid, "j3", consumer="w-b") == transitions.REFUSED
    dead = records.DeadLetter(job="{}", job_id="j3", entry_id=eid, code="x", reason="y", attempts=1, worker="w-b",
                              failed_at=time.time())
    assert transitions.fail(r, stream=keys.jobs(MODEL), dlq=keys.dlq(MODEL), entry_id=eid, consumer="w-b", attempt=1,
                            job_id="j3", error_data="{}", fields={"status": "error"}, dead=dead, dlq_maxlen=10,
                            ttl_after_done=60, reply_maxlen=100,
                            completion=job_record("j3", "t1", "error", "x", None)) == transitions.REFUSED
    assert r.xlen(events_stream("j3")) == 0
    # The owner's failure adds the record with the dead letter.
    assert transitions.fail(r, stream=keys.jobs(MODEL), dlq=keys.dlq(MODEL), entry_id=eid, consumer="w-a", attempt=1,
                            job_id="j3", error_data="{}", fields={"status": "error", "worker": "w-a"}, dead=dead,
                            dlq_maxlen=10, ttl_after_done=60, reply_maxlen=100,
                            completion=job_record("j3", "t1", "error", "x", None)) == transitions.DONE
    [(_, fields)] = r.xrange(events_stream("j3"))
    assert fields["status"] == "error" and fields["id"] == "j3"


def test_records_map_to_openai_event_types():
    def types(rec):
        return CompletionEvent.from_fields(rec).webhook_events()

    assert types(job_record("j", "t", "done", "stop", "responses")) == [("job.completed", "j"),
                                                                        ("response.completed", "resp_j")]
    assert types(job_record("j", "t", "done", "length", "responses"))[1] == ("response.incomplete", "resp_j")
    assert types(job_record("j", "t", "cancelled", "abort", "responses"))[1] == ("response.cancelled", "resp_j")
    assert types(job_record("j", "t", "done", "deadline", "responses"))[1] == ("response.failed", "resp_j")
    assert types(job_record("j", "t", "error", "bad", "responses"))[1] == ("response.failed", "resp_j")
    assert types(job_record("j", "t", "done", "stop", "chat.completions")) == [("job.completed", "j")]
    assert types(batch_record("batch_1", "t", "expired")) == [("batch.expired", "batch_1")]
    ev = CompletionEvent.from_fields(job_record("j", "t", "done", "stop", None, at=77))
    assert ev.payload("job.completed", "j") == {"id": event_id("job.completed", "j"), "object": "event",
                                                "type": "job.completed", "created_at": 77, "data": {"id": "j"}}


def test_the_official_sdk_accepts_the_signature_and_refuses_a_changed_body():
    secret = new_secret()
    body = json.dumps({"id": "evt_1", "object": "event", "type": "batch.completed", "created_at": 1,
                       "data": {"id": "batch_1"}}).encode()
    headers = signed_headers(secret, "wh_1", body)
    event = openai.OpenAI(api_key="x", webhook_secret=secret).webhooks.unwrap(body, headers)
    assert (event.type, event.data.id) == ("batch.completed", "batch_1")
    with pytest.raises(openai.InvalidWebhookSignatureError):
        openai.OpenAI(api_key="x", webhook_secret=secret).webhooks.unwrap(body.replace(b"1", b"2"), headers)
    with pytest.raises(openai.InvalidWebhookSignatureError):
        openai.OpenAI(api_key="x", webhook_secret=new_secret()).webhooks.unwrap(body, headers)


def test_operator_configuration_is_checked():
    secret = new_secret()
    [ep] = parse_config(json.dumps({"*": [{"url": "http://hooks.internal/x", "secret": secret,
                                           "events": ["batch.failed"]}]}))
    assert ep.source == "config" and ep.wants("any-tenant", "batch.failed") and not ep.wants("t", "job.failed")
    assert parse_config(json.dumps({"*": [{"url": "http://hooks.internal/x", "secret": secret}]}))[0].id == ep.id
    with pytest.raises(ValueError, match="whsec_"):
        parse_config(json.dumps({"t": [{"url": "https://a/b", "secret": "plain"}]}))
    with pytest.raises(ValueError, match="unknown event types"):
        check_events(["job.exploded"])
    assert check_secret(secret) == secret


def test_the_outbox_writes_a_delivery_once_and_never_revives_a_settled_one(redis_url):
    async def go():
        ar = aredis.Redis.from_url(redis_url)
        try:
            tag = keys.all_tags()[0]
            stream = keys.completion_events(tag)
            await ar.xgroup_create(stream, EVENTS_GROUP, id="0", mkstream=True)
            d = Delivery(id="wh_a", endpoint="we_1", url="http://x/", tenant="t", type="job.completed",
                         event="evt_a", body="{}", created_at=time.time())
            outbox = Outbox(ar)
            for _ in range(2):  # the same record handled twice (its first dispatcher died after the script)
                eid = await ar.xadd(stream, {"kind": "job"})
                await ar.xreadgroup(EVENTS_GROUP, "c", {stream: ">"})
                await outbox.enqueue(tag, eid.decode(), [d], due=time.time())
            assert await ar.xlen(stream) == 0 and await ar.zcard(keys.webhook_outbox(tag)) == 1
            now = time.time()
            assert await outbox.claim(tag, now, now + 60, 10) == ["wh_a"]
            assert await outbox.claim(tag, now, now + 60, 10) == []  # leased
            assert await outbox.settle(tag, d, "delivered", now=now, attempts=1)
            # A second sender whose lease had passed settles late: refused, nothing comes back.
            assert not await outbox.settle(tag, d, "retry", now=now, attempts=2, error="late", retry_at=now)
            assert await ar.exists(keys.webhook_delivery(tag, "wh_a")) == 0
            assert await ar.zcard(keys.webhook_outbox(tag)) == 0
            assert [x["outcome"] for x in await outbox.recent()] == ["delivered"]
        finally:
            await ar.aclose()

    asyncio.run(go())


def test_a_record_read_by_a_dispatcher_that_died_is_claimed_and_routed_by_another(redis_url):
    from inferq.producer.gateway.webhooks.dispatcher import DispatchPolicy, Dispatcher
    from inferq.producer.gateway.webhooks.endpoints import Endpoint, EndpointStore

    async def go():
        ar = aredis.Redis.from_url(redis_url)
        try:
            tag = keys.all_tags()[0]
            stream = keys.completion_events(tag)
            await ar.xgroup_create(stream, EVENTS_GROUP, id="0", mkstream=True)
            await ar.xadd(stream, job_record("j9", "t9", "done", "stop", None))
            # A gateway reads the record and dies before routing it: it stays pending under its name.
            assert await ar.xreadgroup(EVENTS_GROUP, "dead-gateway", {stream: ">"})
            ep = Endpoint(id="we_t9", tenant="t9", url="http://127.0.0.1:9/", secret=new_secret(), events=())
            d = Dispatcher(ar, EndpointStore(ar, [ep]), Outbox(ar), DispatchPolicy(claim_idle_s=0.05))
            await asyncio.sleep(0.1)
            await d._reclaim()
            assert await ar.xlen(stream) == 0
            assert (await ar.xpending(stream, EVENTS_GROUP))["pending"] == 0
            [did] = [x.decode() for x in await ar.zrange(keys.webhook_outbox(tag), 0, -1)]
            body = json.loads((await Outbox(ar).load(tag, did)).body)
            assert body["type"] == "job.completed" and body["data"] == {"id": "j9"}
        finally:
            await ar.aclose()

    asyncio.run(go())
