"""The OpenAI Batch API through the official `openai` client, against a real
worker (tiny random Llama) behind a real Redis: upload a JSONL with valid and
invalid lines, run it to `completed`, download output and error files, and check
every valid line against the same request sent alone."""
from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import time

import openai
import pytest
from openai import OpenAI

from tests.gateway.stack import TINY, running_gateway
from tests.workers import REPO as ROOT

N_VALID_CHAT = 60


def chat_body(i: int) -> dict:
    return {"model": TINY, "messages": [{"role": "user", "content": f"Item {i}: say something"}],
            "max_tokens": 4, "temperature": 0}


def batch_lines() -> tuple[list[bytes], dict[str, dict], dict[str, str]]:
    """(file lines, valid custom_id -> body, invalid custom_id -> what is wrong)."""
    lines: list[bytes] = []
    valid: dict[str, dict] = {}
    invalid: dict[str, str] = {}

    def add(obj):
        lines.append(json.dumps(obj).encode())

    for i in range(N_VALID_CHAT):
        cid = f"req-{i}"
        valid[cid] = chat_body(i)
        add({"custom_id": cid, "method": "POST", "url": "/v1/chat/completions", "body": valid[cid]})
        if i % 10 == 3:  # sprinkle the invalid lines between the valid ones
            j = len(invalid)
            kind = ["url", "method", "body", "model", "max_tokens"][j % 5]
            bad = f"bad-{j}-{kind}"
            body = chat_body(1000 + j)
            line = {"custom_id": bad, "method": "POST", "url": "/v1/chat/completions", "body": body}
            if kind == "url":
                line["url"] = "/v1/embeddings"
            elif kind == "method":
                line["method"] = "GET"
            elif kind == "body":
                body["messages"] = []
            elif kind == "model":
                body["model"] = "no-such-model"
            else:
                body["max_tokens"] = 10**9
            invalid[bad] = kind
            add(line)
    add({"custom_id": "req-0", "method": "POST", "url": "/v1/chat/completions", "body": chat_body(0)})
    invalid["req-0#dup"] = "duplicate"
    lines.append(b"{this is not json")
    invalid["#json"] = "json"
    return lines, valid, invalid


@pytest.fixture(scope="module")
def batch_gateway(stack, tmp_path_factory):
    files = tmp_path_factory.mktemp("files")
    with running_gateway(stack.url, files_dir=str(files), api_keys="k-all,k-a:team-a,k-b:team-b",
                         batch_max_in_flight=8) as url:
        yield url


def client_for(url: str, key: str) -> OpenAI:
    return OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0, timeout=60)


def wait_status(client: OpenAI, batch_id: str, wanted: set[str], timeout: float = 300):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        b = client.batches.retrieve(batch_id)
        if b.status in wanted:
            return b
        time.sleep(0.2)
    raise TimeoutError(f"batch {batch_id} stayed {b.status} ({b.request_counts})")


def parse_jsonl(text: str) -> list[dict]:
    return [json.loads(x) for x in text.splitlines() if x.strip()]


def test_batch_end_to_end_with_openai_client(batch_gateway):
    client = client_for(batch_gateway, "k-a")
    lines, valid, invalid = batch_lines()
    f = client.files.create(file=("requests.jsonl", io.BytesIO(b"\n".join(lines) + b"\n")), purpose="batch")
    assert f.id.startswith("file-") and f.purpose == "batch" and f.bytes == len(b"\n".join(lines)) + 1
    assert client.files.retrieve(f.id).filename == "requests.jsonl"
    b = client.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h",
                              metadata={"run": "e2e"})
    assert b.id.startswith("batch_") and b.status in ("validating", "in_progress")
    assert b.metadata == {"run": "e2e"} and b.expires_at - b.created_at == 24 * 3600

    b = wait_status(client, b.id, {"completed", "failed", "cancelled", "expired"})
    assert b.status == "completed", b
    total = len(valid) + len(invalid)
    assert b.request_counts.total == total
    assert b.request_counts.completed == len(valid)
    assert b.request_counts.failed == len(invalid)
    assert b.in_progress_at and b.finalizing_at and b.completed_at
    assert b.output_file_id and b.error_file_id

    out = parse_jsonl(client.files.content(b.output_file_id).text)
    errs = parse_jsonl(client.files.content(b.error_file_id).text)
    assert sorted(o["custom_id"] for o in out) == sorted(valid)
    assert len({o["id"] for o in out + errs}) == total

    # Every valid line's completion equals the same request sent alone (greedy).
    for o in out:
        assert o["error"] is None and o["response"]["status_code"] == 200
        body = o["response"]["body"]
        assert body["object"] == "chat.completion" and body["model"] == TINY
        alone = client.chat.completions.create(**valid[o["custom_id"]])
        assert body["choices"][0]["message"]["content"] == alone.choices[0].message.content
        assert body["choices"][0]["finish_reason"] == alone.choices[0].finish_reason
        assert body["usage"]["completion_tokens"] == alone.usage.completion_tokens

    # Every invalid line has an error with a message.
    assert len(errs) == len(invalid)
    by_cid = {e["custom_id"]: e for e in errs}
    for cid, kind in invalid.items():
        if kind == "json":
            e = next(x for x in errs if x["error"]["code"] == "invalid_json")
            assert e["custom_id"] is None and "not valid JSON" in e["error"]["message"]
        elif kind == "duplicate":
            e = next(x for x in errs if x["error"]["code"] == "duplicate_custom_id")
            assert "req-0" in e["error"]["message"]
        else:
            e = by_cid[cid]
            assert e["error"]["message"] and e["error"]["code"]
            expect = {"url": "url", "method": "method", "body": "messages", "model": "no-such-model",
                      "max_tokens": "max_tokens"}[kind]
            assert expect in e["error"]["message"], e

    # The batch is listed, and its files are there to download.
    listed = client.batches.list(limit=100)
    assert b.id in [x.id for x in listed.data]


def test_completions_endpoint_batch(batch_gateway):
    client = client_for(batch_gateway, "k-all")
    prompts = {f"c{i}": {"model": TINY, "prompt": f"Number {i} is", "max_tokens": 3, "temperature": 0}
               for i in range(6)}
    data = "\n".join(json.dumps({"custom_id": k, "method": "POST", "url": "/v1/completions", "body": v})
                     for k, v in prompts.items())
    f = client.files.create(file=("c.jsonl", data.encode()), purpose="batch")
    b = client.batches.create(input_file_id=f.id, endpoint="/v1/completions", completion_window="24h")
    b = wait_status(client, b.id, {"completed", "failed"})
    assert b.status == "completed" and b.request_counts.completed == 6 and b.error_file_id is None
    for o in parse_jsonl(client.files.content(b.output_file_id).text):
        alone = client.completions.create(**prompts[o["custom_id"]])
        assert o["response"]["body"]["object"] == "text_completion"
        assert o["response"]["body"]["choices"][0]["text"] == alone.choices[0].text


def test_tenants_see_only_their_own_files_and_batches(batch_gateway):
    a, other, admin = (client_for(batch_gateway, k) for k in ("k-a", "k-b", "k-all"))
    line = json.dumps({"custom_id": "x", "method": "POST", "url": "/v1/chat/completions", "body": chat_body(1)})
    f = a.files.create(file=("a.jsonl", line.encode()), purpose="batch")
    b = a.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h")
    for call in (lambda: other.files.retrieve(f.id), lambda: other.files.content(f.id),
                 lambda: other.files.delete(f.id), lambda: other.batches.retrieve(b.id),
                 lambda: other.batches.cancel(b.id),
                 lambda: other.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions",
                                              completion_window="24h")):
        with pytest.raises(openai.NotFoundError):
            call()
    assert f.id not in [x.id for x in other.files.list().data]
    assert b.id not in [x.id for x in other.batches.list().data]
    # The owner and an unrestricted key see them.
    assert f.id in [x.id for x in a.files.list().data]
    assert admin.files.retrieve(f.id).id == f.id and admin.batches.retrieve(b.id).id == b.id
    b = wait_status(a, b.id, {"completed"})
    with pytest.raises(openai.NotFoundError):
        other.files.content(b.output_file_id)
    assert a.files.delete(f.id).deleted
    with pytest.raises(openai.NotFoundError):
        a.files.retrieve(f.id)


def test_refusals(batch_gateway):
    client = client_for(batch_gateway, "k-all")
    with pytest.raises(openai.BadRequestError):
        client.files.create(file=("x.jsonl", b"{}"), purpose="fine-tune")
    f = client.files.create(file=("x.jsonl", b"{}\n"), purpose="batch")
    with pytest.raises(openai.BadRequestError):
        client.batches.create(input_file_id=f.id, endpoint="/v1/embeddings", completion_window="24h")
    with pytest.raises(openai.BadRequestError):
        client.batches.create(input_file_id=f.id, endpoint="/v1/completions", completion_window="1h")
    with pytest.raises(openai.NotFoundError):
        client.batches.create(input_file_id="file-nope", endpoint="/v1/completions", completion_window="24h")


def test_upload_caps(stack, tmp_path):
    with running_gateway(stack.url, files_dir=str(tmp_path), files_max_bytes=4096, batch_max_lines=3) as url:
        client = client_for(url, "unused")
        with pytest.raises(openai.APIStatusError) as e:
            client.files.create(file=("big.jsonl", b"x" * 5000), purpose="batch")
        assert e.value.status_code == 413
        with pytest.raises(openai.BadRequestError):
            client.files.create(file=("many.jsonl", b"{}\n" * 4), purpose="batch")
        # Nothing of the refused uploads stays on disk.
        assert [p.name for p in tmp_path.iterdir() if not p.name.startswith(".")] == []


def _cli(url: str, *args: str, key: str = "k-a") -> subprocess.CompletedProcess:
    env = {**os.environ, "INFERQ_GATEWAY_URL": url, "INFERQ_API_KEY": key}
    return subprocess.run([sys.executable, "-m", "inferq.cli", "batch", *args], capture_output=True, text=True,
                          cwd=ROOT, env=env, timeout=300)


def test_cli_submit_wait_status_download(batch_gateway, tmp_path):
    src = tmp_path / "in.jsonl"
    good = [{"custom_id": f"cli-{i}", "method": "POST", "url": "/v1/completions",
             "body": {"model": TINY, "prompt": f"CLI {i}", "max_tokens": 2, "temperature": 0}} for i in range(3)]
    bad = {"custom_id": "cli-bad", "method": "POST", "url": "/v1/completions", "body": {"model": TINY}}
    src.write_text("\n".join(json.dumps(x) for x in [*good, bad]) + "\n")
    r = _cli(batch_gateway, "submit", str(src), "--endpoint", "/v1/completions", "--wait", "--poll", "0.2",
             "--metadata", "origin=cli")
    assert r.returncode == 0, r.stderr
    batch_id = r.stdout.split()[0]
    assert batch_id.startswith("batch_") and "completed" in r.stdout and "3/4 completed, 1 failed" in r.stdout
    r = _cli(batch_gateway, "status", batch_id, "--json")
    status = json.loads(r.stdout)
    assert status["status"] == "completed" and status["metadata"] == {"origin": "cli"}
    r = _cli(batch_gateway, "download", batch_id, "-o", str(tmp_path / "out.jsonl"))
    assert r.returncode == 0, r.stderr
    out = parse_jsonl((tmp_path / "out.jsonl").read_text())
    assert sorted(o["custom_id"] for o in out) == ["cli-0", "cli-1", "cli-2"]
    r = _cli(batch_gateway, "download", batch_id, "--errors")
    errs = parse_jsonl(r.stdout)
    assert [e["custom_id"] for e in errs] == ["cli-bad"] and "prompt" in errs[0]["error"]["message"]
    # Another tenant's key gets a clear error, not the batch.
    r = _cli(batch_gateway, "status", batch_id, key="k-b")
    assert r.returncode == 1 and "404" in r.stderr


def test_sdk_helper(batch_gateway, tmp_path):
    from inferq.producer.batch import BatchClient

    src = tmp_path / "in.jsonl"
    src.write_text(json.dumps({"custom_id": "sdk", "method": "POST", "url": "/v1/chat/completions",
                               "body": chat_body(7)}) + "\n")
    with BatchClient(batch_gateway, api_key="k-all") as bc:
        b = bc.wait(bc.submit(src)["id"], poll_s=0.2, timeout=120)
        assert b["status"] == "completed"
        res = bc.results(b)
        alone = client_for(batch_gateway, "k-all").chat.completions.create(**chat_body(7))
        assert res["sdk"]["response"]["body"]["choices"][0]["message"]["content"] == alone.choices[0].message.content
        assert bc.results(b, errors=True) == {}


def test_a_batch_line_is_the_same_job_as_the_request_alone(stack):
    """The line's job comes from the endpoint's own conversion: only what makes it a
    batch job differs (priority class, metadata, deadline = the batch's expiry)."""
    import asyncio

    from inferq.producer.gateway.backend import Backend
    from inferq.producer.gateway.batch_lines import parse_line
    from inferq.producer.gateway.config import GatewaySettings
    from inferq.producer.gateway.openai_jobs import prepare_chat
    from inferq.producer.gateway.openai_schemas import ChatCompletionRequest
    from inferq.producer.gateway.runner import Context, resolve_model
    from inferq.producer.settings import ProducerSettings

    body = {**chat_body(3), "stop": ["\n"], "top_p": 0.5, "seed": 7, "logprobs": True, "top_logprobs": 2}

    async def both():
        backend = Backend(ProducerSettings(redis_url=stack.url))
        try:
            ctx = Context(backend=backend, settings=GatewaySettings(), default_model=TINY, metrics=None)
            batch = {"id": "batch_x", "endpoint": "/v1/chat/completions", "expires_at": "2000000000",
                     "tenant": "team-a"}
            line = await parse_line(ctx, batch, 1, json.dumps(
                {"custom_id": "c1", "method": "POST", "url": "/v1/chat/completions", "body": body}).encode(), set())
            alone = await prepare_chat(ctx, ChatCompletionRequest.model_validate(body),
                                       lambda n: resolve_model(ctx, n), tenant="team-a", deadline=1.0)
            return line, alone
        finally:
            await backend.close()

    line, alone = asyncio.run(both())
    assert line.error is None
    job = line.prepared.job
    assert job.priority == 100 and alone.job.priority == 0  # INFERQ_GATEWAY_BATCH_PRIORITY
    assert job.metadata == {"route": "chat.completions", "class": "batch", "batch_id": "batch_x", "custom_id": "c1"}
    assert job.deadline == 2000000000 and job.tenant == "team-a"
    # Batch lines run in the batch class: behind every interactive job, preemptible.
    assert job.priority_class == "batch" and alone.job.priority_class == "interactive"
    skip = {"id", "created_at", "priority", "priority_class", "metadata", "deadline"}
    assert job.model_dump(exclude=skip) == alone.job.model_dump(exclude=skip)
    assert job.sampling.logprobs == 2 and job.sampling.stop == ["\n"]
