"""OpenAI's Responses API through the official `openai` client, against real
processes: redis-server, a worker on a tiny random Llama (tests/gateway/stack.py)
and the gateway. Plain, streamed (the SDK assembles the official events), chained
with previous_response_id, structured (``responses.parse``), function tools round
trip, store: false, input items, delete, and 400s for what is not supported."""
from __future__ import annotations

import json
import time
from typing import Literal

import httpx
import openai
import pytest
from openai import OpenAI
from pydantic import BaseModel

from tests.gateway.stack import TINY, running_gateway


@pytest.fixture(scope="module")
def client(gateway_url):
    return OpenAI(base_url=f"{gateway_url}/v1", api_key="unused", max_retries=0, timeout=120)


def create(client, **kw):
    kw.setdefault("model", TINY)
    kw.setdefault("max_output_tokens", 12)
    kw.setdefault("temperature", 0)
    return client.responses.create(**kw)


def test_plain_text_response(client):
    r = create(client, input="Tell me a story", instructions="Be brief.", metadata={"k": "v"})
    assert r.id.startswith("resp_") and r.object == "response"
    assert r.status in ("completed", "incomplete")
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens" or r.status == "completed"
    [msg] = r.output
    assert msg.type == "message" and msg.role == "assistant" and msg.content[0].type == "output_text"
    assert r.output_text == msg.content[0].text and r.output_text
    assert r.usage.output_tokens == 12 or r.status == "completed"
    assert r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens and r.usage.input_tokens > 0
    assert r.instructions == "Be brief." and r.metadata == {"k": "v"} and r.max_output_tokens == 12
    # Stored: retrievable, and the same object.
    again = client.responses.retrieve(r.id)
    assert again.model_dump() == r.model_dump()


def test_streamed_events_assemble_to_the_stored_response(client):
    events = list(create(client, input=[{"role": "user", "content": "Count"}], stream=True))
    types = [e.type for e in events]
    assert types[:3] == ["response.created", "response.in_progress", "response.output_item.added"]
    assert types[3] == "response.content_part.added"
    assert types[-4:-1] == ["response.output_text.done", "response.content_part.done", "response.output_item.done"]
    assert types[-1] in ("response.incomplete", "response.completed")  # max_output_tokens, or the model's EOS
    assert [e.sequence_number for e in events] == list(range(len(events)))
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    final = events[-1].response
    assert final.output_text == deltas and deltas
    assert client.responses.retrieve(final.id).output_text == deltas
    # Greedy: the same request unstreamed writes the same text.
    assert create(client, input="Count").output_text == deltas
    # The SDK's own stream helper (which checks the events' shapes as it accumulates them).
    with client.responses.stream(model=TINY, input="Count", max_output_tokens=12, temperature=0) as s:
        helper = list(s)
    assert next(e for e in helper if e.type == "response.output_text.done").text == deltas
    assert helper[-1].type == types[-1] and helper[-1].response.output_text == deltas


def test_a_foreground_stream_dropped_by_its_client_cancels_the_job(client, stack):
    import redis

    from inferq.schemas import keys

    stream = create(client, input="Go on", max_output_tokens=4000, temperature=0.8, stream=True,
                    extra_body={"ignore_eos": True})
    for ev in stream:
        if ev.type == "response.output_text.delta":
            break
    stream.close()
    job = ev.item_id.split("_")[1]
    r = redis.Redis.from_url(stack.url)
    try:
        end = time.monotonic() + 60
        while r.hget(keys.job_info(job), "status") != b"cancelled":
            assert time.monotonic() < end, r.hgetall(keys.job_info(job))
            time.sleep(0.1)
    finally:
        r.close()
    assert client.responses.retrieve(f"resp_{job}").status == "cancelled"


def test_previous_response_id_chains_the_conversation(client):
    first = create(client, input="My name is Ada.", instructions="Answer shortly.")
    second = create(client, input="What is my name?", previous_response_id=first.id)
    assert second.previous_response_id == first.id and second.status in ("completed", "incomplete")
    # The chain is in the prompt: the first turn, its answer and the new turn.
    alone = create(client, input="What is my name?")
    assert second.usage.input_tokens > alone.usage.input_tokens + 5
    items = client.responses.input_items.list(second.id)
    assert [i.content[0].text for i in items.data] == ["What is my name?"]
    with pytest.raises(openai.BadRequestError) as e:
        create(client, input="x", previous_response_id="resp_nope")
    assert e.value.body["param"] == "previous_response_id"


class City(BaseModel):
    city: Literal["Paris", "Rome"]  # an enum keeps the tiny random model's answer short
    sunny: bool


def test_parse_with_a_pydantic_model(client):
    r = client.responses.parse(model=TINY, input="Where?", text_format=City, max_output_tokens=60, temperature=0)
    assert r.status == "completed", r.status
    assert isinstance(r.output_parsed, City)
    assert City.model_validate_json(r.output_text) == r.output_parsed
    assert r.text.format.type == "json_schema"


def test_json_object_and_bad_schema(client):
    r = create(client, input="JSON please", text={"format": {"type": "json_object"}}, max_output_tokens=80)
    if r.status == "completed":
        assert isinstance(json.loads(r.output_text), dict)
    with pytest.raises(openai.BadRequestError) as e:
        create(client, input="x", text={"format": {"type": "json_schema", "name": "x",
                                                   "schema": {"type": "array", "uniqueItems": True}}})
    assert e.value.body["param"] == "text.format"


WEATHER = {"type": "function", "name": "get_weather", "description": "Weather in a city",
           "parameters": {"type": "object", "properties": {"city": {"enum": ["Paris", "Rome"]}},
                          "required": ["city"], "additionalProperties": False}}


def test_function_tools_round_trip(client):
    r = create(client, input="Weather in Paris?", tools=[WEATHER],
               tool_choice={"type": "function", "name": "get_weather"}, max_output_tokens=40)
    assert r.status == "completed"
    [call] = r.output
    assert call.type == "function_call" and call.name == "get_weather" and call.status == "completed"
    assert json.loads(call.arguments)["city"] in ("Paris", "Rome")
    # Streamed: the argument events carry the same call.
    events = list(create(client, input="Weather in Paris?", tools=[WEATHER],
                         tool_choice={"type": "function", "name": "get_weather"}, max_output_tokens=40, stream=True))
    args = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    done = next(e for e in events if e.type == "response.function_call_arguments.done")
    assert args == done.arguments == call.arguments and events[-1].type == "response.completed"
    # The tool's answer goes back as a function_call_output item (chained, and sent whole).
    answer = {"type": "function_call_output", "call_id": call.call_id, "output": '{"temp_c": 21}'}
    chained = create(client, previous_response_id=r.id, input=[answer], tools=[WEATHER])
    whole = create(client, input=[{"role": "user", "content": "Weather in Paris?"},
                                  {"type": "function_call", "call_id": call.call_id, "name": call.name,
                                   "arguments": call.arguments}, answer], tools=[WEATHER])
    assert chained.status in ("completed", "incomplete") and whole.status in ("completed", "incomplete")
    assert chained.usage.input_tokens == whole.usage.input_tokens
    assert chained.output_text == whole.output_text


def test_store_false_is_not_retrievable_nor_continued(client):
    r = create(client, input="Hi", store=False)
    assert r.store is False and r.output_text
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(r.id)
    with pytest.raises(openai.BadRequestError):
        create(client, input="again", previous_response_id=r.id)
    with pytest.raises(openai.BadRequestError) as e:
        create(client, input="Hi", store=False, background=True)
    assert e.value.body["param"] == "background"


def test_delete_and_input_items(client):
    r = create(client, input=[{"role": "developer", "content": "Be terse."},
                              {"role": "user", "content": [{"type": "input_text", "text": "One"},
                                                           {"type": "input_text", "text": " two"}]}])
    items = list(client.responses.input_items.list(r.id, order="asc", limit=1))  # the SDK follows the pages
    assert [(i.role, i.content[0].text) for i in items] == [("developer", "Be terse."), ("user", "One")]
    client.responses.delete(r.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(r.id)


@pytest.mark.parametrize("body, param", [
    ({"tools": [{"type": "web_search"}]}, "tools[0].type"),
    ({"tools": [{"type": "file_search", "vector_store_ids": ["v"]}]}, "tools[0].type"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "http://x/y.png"}]}]},
     "input[0].content[0].type"),
    ({"input": [{"type": "input_file", "file_id": "f"}]}, "input[0].type"),
    ({"reasoning": {"effort": "high"}}, "reasoning"),
    ({"include": ["message.output_text.logprobs"]}, "include"),
    ({"truncation": "auto"}, "truncation"),
    ({"tool_choice": {"type": "web_search_preview"}}, "tool_choice"),
    ({"max_output_tokens": 10**6}, "max_output_tokens"),
    ({"metadata": {f"k{i}": "v" for i in range(17)}}, "metadata"),
])
def test_unsupported_fields_are_400s_naming_them(gateway_url, body, param):
    body = {"model": TINY, "input": "x", **body}
    resp = httpx.post(f"{gateway_url}/v1/responses", json=body, timeout=30)
    assert resp.status_code == 400, resp.text
    assert resp.json()["error"]["param"] == param, resp.json()


def test_tenants_see_only_their_own_responses_and_each_keeps_a_bounded_number(stack):
    with running_gateway(stack.url, api_keys="ka:alice,kb:bob", responses_max_per_tenant=2) as url:
        alice, bob = (OpenAI(base_url=f"{url}/v1", api_key=k, max_retries=0, timeout=120) for k in ("ka", "kb"))
        ids = [create(alice, input=f"turn {i}", max_output_tokens=2).id for i in range(3)]
        theirs = create(bob, input="mine", max_output_tokens=2)
        with pytest.raises(openai.NotFoundError):
            bob.responses.retrieve(ids[2])
        with pytest.raises(openai.BadRequestError):
            create(bob, input="x", previous_response_id=ids[2])
        with pytest.raises(openai.NotFoundError):  # the oldest of alice's three went
            alice.responses.retrieve(ids[0])
        assert [alice.responses.retrieve(i).id for i in ids[1:]] == ids[1:]
        assert bob.responses.retrieve(theirs.id).id == theirs.id
