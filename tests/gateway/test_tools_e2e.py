"""Tool calling through the official `openai` client against real processes:
redis-server, a worker serving the bundled SmolLM2-135M-Instruct (its template
has no tool support, so the worker's Hermes-style fallback prompt is used), and
the gateway. Forced calls (a named function, "required") are enforced by the
engine's grammar; the auto round trip is call -> tool message -> final answer.
Greedy throughout, so streamed and non-streamed answers must agree exactly."""
import json

import openai
import pytest
from openai import OpenAI

from tests.workers import WorkerProc

SMOL = "smol-tools"

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 32}},
                   "required": ["city"], "additionalProperties": False}}}
CLOCK = {"type": "function", "function": {
    "name": "get_time", "description": "Get the local time in a time zone",
    "parameters": {"type": "object", "properties": {"timezone": {"type": "string", "maxLength": 40}},
                   "required": ["timezone"], "additionalProperties": False}}}
TOOLS = [WEATHER, CLOCK]
ASK = [{"role": "user", "content": "What is the weather like in Paris right now?"}]
NAMED = {"type": "function", "function": {"name": "get_weather"}}


@pytest.fixture(scope="module")
def smol_worker(stack):
    from inferq.gpuworker.models.loader import bundled_model_path, converted_folder

    w = WorkerProc(stack.url, converted_folder(bundled_model_path()), SMOL, stack.tmp, "tools-worker",
                   "--device", "cpu", "--dtype", "float32", "--max-num-seqs", "8", "--num-kv-blocks", "256",
                   "--lease-seconds", "5", defaults=())
    try:
        w.wait_ready(240)
        yield w
    finally:
        w.terminate(timeout=20)


@pytest.fixture(scope="module")
def client(gateway_url, smol_worker):
    return OpenAI(base_url=f"{gateway_url}/v1", api_key="unused", max_retries=0, timeout=300)


def chat(client, messages=ASK, **kw):
    kw.setdefault("tools", TOOLS)
    kw.setdefault("max_tokens", 80)
    return client.chat.completions.create(model=SMOL, messages=messages, temperature=0, **kw)


def streamed(client, messages=ASK, **kw):
    """The SDK's own assembly of a streamed answer, and the raw chunks."""
    kw.setdefault("tools", TOOLS)
    chunks = []
    with client.chat.completions.stream(model=SMOL, messages=messages, temperature=0, max_tokens=80, **kw) as s:
        for event in s:
            if event.type == "chunk":
                chunks.append(event.chunk)
        final = s.get_final_completion()
    return final, chunks


def calls_of(message):
    return [(c.function.name, c.function.arguments) for c in message.tool_calls or []]


def assert_valid_weather_call(call):
    assert call.type == "function" and call.id.startswith("call_")
    assert call.function.name == "get_weather"
    args = json.loads(call.function.arguments)
    assert set(args) == {"city"} and isinstance(args["city"], str) and len(args["city"]) <= 32


def test_forced_named_call(client):
    r = chat(client, tool_choice=NAMED)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    assert len(choice.message.tool_calls) == 1
    assert_valid_weather_call(choice.message.tool_calls[0])


def test_forced_named_call_streamed_assembles_to_the_same_call(client):
    whole = chat(client, tool_choice=NAMED).choices[0]
    final, chunks = streamed(client, tool_choice=NAMED)
    choice = final.choices[0]
    assert calls_of(choice.message) == calls_of(whole.message)
    assert choice.finish_reason == "tool_calls"
    assert not choice.message.content
    # The call opens with its id and name, then the arguments arrive in pieces as generated.
    parts = [tc for c in chunks if c.choices for tc in (c.choices[0].delta.tool_calls or [])]
    assert parts[0].id.startswith("call_") and parts[0].function.name == "get_weather"
    assert all(p.index == 0 for p in parts)
    assert sum(1 for p in parts if p.function and p.function.arguments) >= 3
    assert all(not (c.choices and c.choices[0].delta.content) for c in chunks)


@pytest.mark.parametrize("stream", [False, True])
def test_required_without_parallel_calls_gives_exactly_one_valid_call(client, stream):
    kw = dict(tool_choice="required", parallel_tool_calls=False)
    choice = (streamed(client, **kw)[0] if stream else chat(client, **kw)).choices[0]
    assert choice.finish_reason == "tool_calls"
    assert len(choice.message.tool_calls) == 1
    call = choice.message.tool_calls[0]
    assert call.function.name in ("get_weather", "get_time")
    params = next(t for t in TOOLS if t["function"]["name"] == call.function.name)["function"]["parameters"]
    assert set(json.loads(call.function.arguments)) == set(params["required"])
    if stream:
        assert calls_of(choice.message) == calls_of(chat(client, **kw).choices[0].message)


def _round_trip_messages(client):
    """Turn 1: a forced call; then the assistant's call and the tool's answer go back."""
    first = chat(client, tool_choice=NAMED).choices[0].message
    assert_valid_weather_call(first.tool_calls[0])
    assistant = first.model_dump(exclude_none=True)  # {"role": "assistant", "tool_calls": [...]}
    tool = {"role": "tool", "tool_call_id": first.tool_calls[0].id,
            "content": json.dumps({"city": json.loads(first.tool_calls[0].function.arguments)["city"],
                                   "temperature_c": 18, "sky": "sunny"})}
    return ASK + [assistant, tool]


def test_auto_round_trip_call_tool_answer(client):
    messages = _round_trip_messages(client)
    final = chat(client, messages, tool_choice="auto").choices[0]
    assert final.finish_reason == "stop"
    assert final.message.tool_calls is None
    assert isinstance(final.message.content, str) and final.message.content.strip()
    # Streamed, the SDK assembles the same answer.
    s = streamed(client, messages, tool_choice="auto")[0].choices[0]
    assert (s.message.content, s.finish_reason, s.message.tool_calls) == (final.message.content, "stop", None)


def test_tool_turns_render_with_tool_choice_none_and_without_tools(client):
    messages = _round_trip_messages(client)
    for kw in ({"tool_choice": "none"}, {"tools": openai.NOT_GIVEN}):
        r = chat(client, messages, **kw).choices[0]
        assert r.message.tool_calls is None and r.finish_reason in ("stop", "length")


def test_tool_choice_none_leaves_the_tools_out_of_the_prompt(client):
    plain = chat(client, tools=openai.NOT_GIVEN, max_tokens=1).usage.prompt_tokens
    assert chat(client, tool_choice="none", max_tokens=1).usage.prompt_tokens == plain
    # The fallback prompt describes every tool to the model.
    assert chat(client, tool_choice="auto", max_tokens=1).usage.prompt_tokens > plain + 60


BAD = [
    (dict(tools=[{"type": "function", "function": {"name": "get weather"}}]), "tools.0.function.name"),
    (dict(tools=[{"type": "retrieval", "function": {"name": "x"}}]), "tools.0.type"),
    (dict(tools=[{"type": "function", "function": {"name": "f", "parameters": {"type": "strin"}}}]),
     "Invalid type: strin"),
    (dict(tool_choice={"type": "function", "function": {"name": "send_email"}}), "send_email"),
    (dict(tools=[WEATHER, WEATHER]), "two tools are named"),
    (dict(tools=openai.NOT_GIVEN, tool_choice="required"), "tool_choice needs tools"),
    (dict(tool_choice="required", response_format={"type": "json_object"}), "cannot be combined"),
]


@pytest.mark.parametrize("kw,says", BAD)
def test_bad_tool_requests_are_400_with_a_reason(client, kw, says):
    with pytest.raises(openai.BadRequestError) as e:
        chat(client, **kw)
    assert says in str(e.value)


def test_tool_message_without_its_call_id_is_400(client):
    with pytest.raises(openai.BadRequestError, match="tool_call_id"):
        chat(client, ASK + [{"role": "tool", "content": "18C"}])
