"""n > 1 in Batch API lines: a line's response body carries every choice, as the
same request sent alone does (tiny Llama worker, real Redis, the `openai` client)."""
from __future__ import annotations

import json

import pytest

from tests.gateway.stack import TINY, running_gateway
from tests.gateway.test_batch_api import client_for, parse_jsonl, wait_status


@pytest.fixture(scope="module")
def batch_gateway(stack, tmp_path_factory):
    files = tmp_path_factory.mktemp("files-n")
    with running_gateway(stack.url, files_dir=str(files), api_keys="k-all", batch_max_in_flight=4) as url:
        yield url


def test_batch_lines_with_n_give_every_choice(batch_gateway):
    client = client_for(batch_gateway, "k-all")
    bodies = {
        "chat": ("/v1/chat/completions", {"model": TINY, "messages": [{"role": "user", "content": "Hi"}],
                                          "max_tokens": 5, "temperature": 0, "n": 3}),
        "cmpl": ("/v1/completions", {"model": TINY, "prompt": "Number 3 is", "max_tokens": 5, "temperature": 0,
                                     "n": 2}),
    }
    for cid, (url, body) in bodies.items():
        data = json.dumps({"custom_id": cid, "method": "POST", "url": url, "body": body})
        f = client.files.create(file=(f"{cid}.jsonl", data.encode()), purpose="batch")
        b = wait_status(client, client.batches.create(input_file_id=f.id, endpoint=url, completion_window="24h").id,
                        {"completed", "failed"})
        assert b.status == "completed" and b.request_counts.completed == 1
        (line,) = parse_jsonl(client.files.content(b.output_file_id).text)
        choices = line["response"]["body"]["choices"]
        assert [c["index"] for c in choices] == list(range(body["n"]))
        if cid == "chat":
            alone = client.chat.completions.create(**{**body, "n": 1})
            assert [c["message"]["content"] for c in choices] == [alone.choices[0].message.content] * 3
        else:
            alone = client.completions.create(**{**body, "n": 1})
            assert [c["text"] for c in choices] == [alone.choices[0].text] * 2
        assert line["response"]["body"]["usage"]["completion_tokens"] == body["n"] * alone.usage.completion_tokens
