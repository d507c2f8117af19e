"""Responses stream events as a function of the reply stream (producer/gateway/
responses_format.py), without processes: the same reply stream gives the same
numbered events to every reader, a continued attempt (request migration) adds no
repeat, and the streamed items assemble to the body a retrieve builds."""
from __future__ import annotations

import random

from inferq.schemas.events import DeltaEvent, DoneEvent, QueuedEvent, RestartedEvent, ResumePoint, StartedEvent, Usage
from inferq.schemas.fold import Assembly
from inferq.producer.gateway.responses_format import ResponseEvents, folded_body
from inferq.producer.gateway.responses_spec import ResponseSpec

TOOLS = [{"type": "function", "name": "get_weather", "description": None, "strict": None,
          "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}]
TEXT = 'Let me check. <tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'


def spec(**kw) -> ResponseSpec:
    return ResponseSpec(job_id="j1", model="m", created_at=1700000000, background=True, tool_parser="hermes", **kw)


def reply_stream(text: str, cut: int, rng: random.Random) -> list:
    """Attempt 1 publishes text[:cut] in random pieces and dies; attempt 2 continues."""
    def pieces(s: str):
        out, i = [], 0
        while i < len(s):
            n = rng.randint(1, 7)
            out.append(s[i:i + n])
            i += n
        return out

    events, seq = [QueuedEvent(seq=0), StartedEvent(attempt=1, seq=0, worker="w1")], 1
    tokens = 0
    for p in pieces(text[:cut]):
        events.append(DeltaEvent(attempt=1, seq=seq, text=p, token_ids=[tokens]))
        seq, tokens = seq + 1, tokens + 1
    events += [RestartedEvent(attempt=2, seq=0, resume=[ResumePoint(tokens=tokens, chars=cut)]),
               StartedEvent(attempt=2, seq=1, worker="w2")]
    seq = 2
    for p in pieces(text[cut:]):
        events.append(DeltaEvent(attempt=2, seq=seq, text=p, token_ids=[tokens]))
        seq, tokens = seq + 1, tokens + 1
    events.append(DoneEvent(attempt=2, seq=seq, finish_reason="stop",
                            usage=Usage(prompt_tokens=9, completion_tokens=tokens)))
    return events


def all_events(s: ResponseSpec, stream: list) -> list[dict]:
    gen = ResponseEvents(s)
    out = gen.opening()
    for ev in stream:
        out += gen.feed(ev)
    return out


def test_the_same_reply_stream_gives_the_same_numbered_events_and_the_stored_body():
    rng = random.Random(3)
    for trial in range(20):
        s = spec(tools=TOOLS)
        stream = reply_stream(TEXT, rng.randint(0, len(TEXT)), rng)
        first, again = all_events(s, stream), all_events(s, stream)
        assert first == again
        assert [e["sequence_number"] for e in first] == list(range(len(first)))
        types = [e["type"] for e in first]
        assert types[:3] == ["response.created", "response.queued", "response.in_progress"]
        assert types.count("response.in_progress") == 1  # a new attempt is not a new response
        assert types[-1] == "response.completed"
        final = first[-1]["response"]
        asm = Assembly()
        for ev in stream:
            asm.feed(ev)
        assert final["output"] == folded_body(s, asm, None)["output"]
        message, call = final["output"]
        assert message["content"][0]["text"] == "".join(
            e["delta"] for e in first if e["type"] == "response.output_text.delta") == "Let me check."
        assert call["name"] == "get_weather" and call["call_id"] == "call_j1_1" and call["status"] == "completed"
        assert call["arguments"] == "".join(e["delta"] for e in first
                                            if e["type"] == "response.function_call_arguments.delta")
        assert final["usage"] == {"input_tokens": 9, "input_tokens_details": {"cached_tokens": 0},
                                  "output_tokens": asm.usage["completion_tokens"],
                                  "output_tokens_details": {"reasoning_tokens": 0},
                                  "total_tokens": 9 + asm.usage["completion_tokens"]}


def test_length_is_incomplete_and_without_tools_text_is_one_message():
    stream = [StartedEvent(attempt=1, seq=0), DeltaEvent(attempt=1, seq=1, text="Hi <tool_call>", token_ids=[1]),
              DoneEvent(attempt=1, seq=2, finish_reason="length")]
    events = all_events(spec(), stream)
    final = events[-1]
    assert final["type"] == "response.incomplete" and final["response"]["status"] == "incomplete"
    assert final["response"]["incomplete_details"] == {"reason": "max_output_tokens"}
    [item] = final["response"]["output"]
    assert item["status"] == "incomplete" and item["content"][0]["text"] == "Hi <tool_call>"


def test_input_items_become_chat_messages():
    from inferq.producer.gateway.responses_input import items_to_messages, normalize_input

    call = {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": '{"city": "Paris"}'}
    items = normalize_input([{"role": "developer", "content": "Be terse."}, {"role": "user", "content": "Weather?"},
                             {"role": "assistant", "content": "Checking."}, call,
                             {"type": "function_call_output", "call_id": "c1", "output": "21 C"}], "j")
    assert [i["id"] for i in items] == ["msg_j_in0", "msg_j_in1", "msg_j_in2", "fc_j_in3", "fco_j_in4"]
    whole = items_to_messages(items)
    assert whole == [
        {"role": "system", "content": "Be terse."}, {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": "Checking.", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "content": "21 C", "tool_call_id": "c1", "name": "get_weather"}]
    # The answer sent in a later request (the call in the chain before it) is the same turn.
    assert items_to_messages(items[-1:], whole[:-1]) == whole[-1:]
