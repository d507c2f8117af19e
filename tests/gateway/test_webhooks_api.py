"""Webhook endpoints through the official `openai` client, and the two ends a
delivery can reach besides success: a permanently failing endpoint ends in the
dead-letter list with its last error (and on the dashboard and /metrics); a
batch that completes sends ``batch.completed`` to an operator-configured
endpoint, verified by the receiver process with the SDK's ``webhooks.unwrap``."""
from __future__ import annotations

import io
import json
import time
import urllib.request

import openai
import pytest
import redis
from openai import OpenAI

from inferq.schemas import keys
from inferq.producer.gateway.webhooks.endpoints import new_secret
from tests.gateway.stack import TINY, running_gateway
from tests.gateway.test_webhooks import Receiver, wait_for

pytestmark = pytest.mark.timeout(300)


def client(url: str, key: str) -> OpenAI:
    return OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0, timeout=30)


def test_a_tenant_sees_and_changes_only_its_own_endpoints(stack, tmp_path):
    with running_gateway(stack.url, files_dir=str(tmp_path), api_keys="k-a:alpha,k-b:beta") as url:
        a, b = client(url, "k-a"), client(url, "k-b")
        ep = a.webhooks.create(url="https://hooks.example.com/a", name="a", event_types=["response.completed"])
        assert ep.signing_secret.startswith("whsec_") and ep.event_types == ["response.completed"]
        assert ep.signing_secret_hint.endswith(ep.signing_secret[-4:])
        listed = a.webhooks.list().data
        assert [e.id for e in listed] == [ep.id]
        assert "signing_secret" not in listed[0].model_dump()  # shown once, at creation
        assert b.webhooks.list().data == []
        with pytest.raises(openai.NotFoundError):
            b.webhooks.retrieve(ep.id)
        with pytest.raises(openai.NotFoundError):
            b.webhooks.delete(ep.id)
        with pytest.raises(openai.NotFoundError):
            b.webhooks.rotate_secret(ep.id)
        rotated = a.webhooks.rotate_secret(ep.id)
        assert rotated.signing_secret != ep.signing_secret
        with pytest.raises(openai.AuthenticationError):
            client(url, "k-nobody").webhooks.list()
        with pytest.raises(openai.BadRequestError, match="https"):
            a.webhooks.create(url="http://plain.example.com/", name="x", event_types=["batch.completed"])
        with pytest.raises(openai.BadRequestError, match="unknown event types"):
            a.webhooks.create(url="https://hooks.example.com/", name="x", event_types=["eval.run.failed"])
        assert a.webhooks.delete(ep.id).deleted
        assert a.webhooks.list().data == []


def test_a_permanently_failing_endpoint_ends_in_the_dead_letter_list_with_its_reason(stack, tmp_path):
    tenant = f"dl-{time.time_ns()}"
    receiver = Receiver(tmp_path, failing=True).start()
    try:
        with running_gateway(stack.url, files_dir=str(tmp_path), api_keys=f"k-dl:{tenant}",
                             dashboard_keys="ops", webhook_allow_http=True, webhook_max_attempts=3,
                             webhook_backoff_s=0.1, webhook_backoff_max_s=0.2) as url:
            ep = client(url, "k-dl").webhooks.create(url=receiver.url, name="broken", event_types=["job.completed"])
            job = client(url, "k-dl").completions.create(model=TINY, prompt="hello", max_tokens=2)

            def dead():
                req = urllib.request.Request(f"{url}/dashboard/api/webhooks?limit=200",
                                             headers={"Authorization": "Bearer ops"})
                rows = json.loads(urllib.request.urlopen(req, timeout=10).read())["dead"]
                return [x for x in rows if x["tenant"] == tenant]

            [row] = wait_for(dead, 120, "the dead letter")
            assert row["endpoint"] == ep.id and row["type"] == "job.completed" and row["attempts"] == 3
            assert row["error"] == "HTTP 500: receiver is broken on purpose"
            assert job.id  # the request itself was served: delivery never sits on its path
            metrics = urllib.request.urlopen(f"{url}/metrics", timeout=10).read().decode()
            assert 'inferq_gateway_webhook_deliveries_total{outcome="dead"} 1.0' in metrics
            assert 'inferq_gateway_webhook_deliveries_total{outcome="retry"} 2.0' in metrics
            page = urllib.request.urlopen(urllib.request.Request(
                f"{url}/dashboard", headers={"Authorization": "Bearer ops"}), timeout=10).read().decode()
            assert 'id="webhook-dead-table"' in page
            script = urllib.request.urlopen(f"{url}/dashboard/static/dashboard.js", timeout=10).read().decode()
            assert "/dashboard/api/webhooks" in script
    finally:
        receiver.stop()


def test_a_completed_batch_is_announced_to_an_operator_configured_endpoint(stack, tmp_path):
    tenant = f"batcher-{time.time_ns()}"
    receiver = Receiver(tmp_path)
    secret = new_secret()
    receiver.secret_file.write_text(secret)
    receiver.start()
    config = json.dumps({tenant: [{"url": receiver.url, "secret": secret, "events": ["batch.completed"]}]})
    try:
        with running_gateway(stack.url, files_dir=str(tmp_path / "files"), api_keys=f"k-b:{tenant}",
                             webhooks=config) as url:
            c = client(url, "k-b")
            listed = c.webhooks.list().data
            assert [e.url for e in listed] == [receiver.url]  # the operator's endpoint, shown read-only
            with pytest.raises(openai.PermissionDeniedError):
                c.webhooks.delete(listed[0].id)
            lines = [json.dumps({"custom_id": f"r{i}", "method": "POST", "url": "/v1/chat/completions",
                                 "body": {"model": TINY, "max_tokens": 2,
                                          "messages": [{"role": "user", "content": f"hi {i}"}]}}) for i in range(2)]
            f = c.files.create(file=("in.jsonl", io.BytesIO("\n".join(lines).encode())), purpose="batch")
            batch = c.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h")
            got = wait_for(lambda: [x for x in receiver.received() if x["data_id"] == batch.id], 180,
                           "batch.completed at the receiver")
            assert {x["type"] for x in got} == {"batch.completed"}
            assert c.batches.retrieve(batch.id).status == "completed"
    finally:
        receiver.stop()


def test_failed_and_cancelled_jobs_announce_job_failed_and_job_cancelled(stack, tmp_path):
    from inferq.producer import Producer

    tenant = f"ends-{time.time_ns()}"
    receiver = Receiver(tmp_path).start()
    try:
        with running_gateway(stack.url, files_dir=str(tmp_path), api_keys=f"k-e:{tenant}",
                             webhook_allow_http=True) as url:
            ep = client(url, "k-e").webhooks.create(url=receiver.url, name="ends",
                                                    event_types=["job.failed", "job.cancelled"])
            receiver.secret_file.write_text(ep.signing_secret)
            producer = Producer(stack.url, default_model=TINY)
            # Longer than the model's 4096 positions: the worker refuses it (error + dead letter).
            failed = producer.submit(prompt_token_ids=[5] * 5000, tenant=tenant, sampling={"max_tokens": 1})
            # Cancelled at once: long before 2,000 tokens could be generated.
            cancelled = producer.submit("count to a million", tenant=tenant,
                                        sampling={"max_tokens": 2000, "ignore_eos": True})
            cancelled.cancel()
            done = producer.submit("hi", tenant=tenant, sampling={"max_tokens": 1})  # not subscribed
            wait_for(lambda: len(receiver.received()) >= 2, 120, "both events")
            assert done.result(timeout=60).finish_reason in ("stop", "length")
            r = redis.Redis.from_url(stack.url)
            wait_for(lambda: all(r.xlen(keys.completion_events(t)) == 0 for t in keys.all_tags()), 60,
                     "every record routed")
            r.close()
            producer.close()
            assert sorted((x["type"], x["data_id"]) for x in receiver.received()) == [
                ("job.cancelled", cancelled.id), ("job.failed", failed.id)]
    finally:
        receiver.stop()
