"""Reproducible answers at temperature 0, as users of a job queue expect them:
the Batch API's lines (run together, batched by the engine) equal the same
requests sent alone, on the real bundled SmolLM2 in float32 and bfloat16 (the
default on CPUs with AVX512-BF16). Real Redis, worker and gateway; the official
`openai` client."""
from __future__ import annotations

import io
import json

import pytest
from openai import OpenAI

from inferq.gpuworker.models.loader import bundled_model_path
from inferq.schemas import keys
from tests.conftest import RedisServer
from tests.gateway.stack import running_gateway
from tests.gateway.test_batch_api import parse_jsonl, wait_status
from tests.workers import WorkerProc

MODEL = keys.DEFAULT_MODEL
TOPICS = ["the sea", "a small town", "bread", "winter", "a lighthouse", "rivers", "the moon", "trains",
          "a library", "mountains"]


def body(topic: str) -> dict:
    return {"model": MODEL, "max_tokens": 32, "temperature": 0,
            "messages": [{"role": "user", "content": f"Write two sentences about {topic}."}]}


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_batch_lines_equal_the_requests_sent_alone(tmp_path, dtype):
    (tmp_path / "redis").mkdir()
    server = RedisServer(tmp_path / "redis").start()
    worker = WorkerProc(server.url, bundled_model_path(), MODEL, tmp_path, f"inv-{dtype}", "--dtype", dtype,
                        "--max-num-seqs", "16", metrics=True)
    try:
        worker.wait_ready(300)
        with running_gateway(server.url, files_dir=str(tmp_path / "files")) as gw:
            client = OpenAI(base_url=f"{gw}/v1", api_key="none", max_retries=0, timeout=300)
            lines = [json.dumps({"custom_id": t, "method": "POST", "url": "/v1/chat/completions", "body": body(t)})
                     for t in TOPICS]
            f = client.files.create(file=("lines.jsonl", io.BytesIO("\n".join(lines).encode())), purpose="batch")
            b = client.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h")
            b = wait_status(client, b.id, {"completed", "failed", "cancelled", "expired"}, timeout=600)
            assert b.status == "completed" and b.request_counts.completed == len(TOPICS), b
            batched = {o["custom_id"]: o["response"]["body"]["choices"][0]["message"]["content"]
                       for o in parse_jsonl(client.files.content(b.output_file_id).text)}
            alone = {t: client.chat.completions.create(**body(t)).choices[0].message.content for t in TOPICS}
        differ = [t for t in TOPICS if batched[t] != alone[t]]
        assert not differ, {t: (batched[t], alone[t]) for t in differ}
    finally:
        worker.terminate(timeout=30)
        server.stop()
