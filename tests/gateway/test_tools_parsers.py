"""The tool-call parsers on model outputs of each family: the calls and content
they find, and that feeding the text in any pieces (as a stream arrives)
assembles to exactly the whole-text result."""
import json
import random

import pytest

from inferq.producer.gateway.tool_parsers import ArgsDelta, CallStart, Content, forced_stream, parse, tool_stream

TOOLS = ["get_weather", "search"]

# (parser, model output, expected content, expected [(name, arguments text)])
CASES = [
    # Qwen2.5 / Qwen3 / Hermes
    ("hermes", '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
     "", [("get_weather", '{"city": "Paris"}')]),
    ("hermes", 'Let me look.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}\n'
               '</tool_call>\n<tool_call>\n{"name": "search", "arguments": {"q": "a \\"quoted\\" } brace"}}\n'
               '</tool_call>',
     "Let me look.", [("get_weather", '{"city": "Paris", "days": 3}'), ("search", '{"q": "a \\"quoted\\" } brace"}')]),
    ("hermes", '<tool_call>{"arguments": {"x": [1, {"y": null}]}, "name": "search"}</tool_call>',
     "", [("search", '{"x": [1, {"y": null}]}')]),
    ("hermes", '<tool_call>\n{"name": "search"}\n</tool_call>', "", [("search", "{}")]),
    ("hermes", "<tool_call>not JSON</tool_call> so plain text", "<tool_call>not JSON</tool_call> so plain text", []),
    ("hermes", "a <tool_ca b", "a <tool_ca b", []),
    ("hermes", "No tools needed.\n", "No tools needed.\n", []),
    # Qwen3 thinking first
    ("hermes", '<think>\nI should call it.\n</think>\n\n<tool_call>\n{"name": "search", "arguments": {"q": "x"}}\n'
               '</tool_call>', "<think>\nI should call it.\n</think>", [("search", '{"q": "x"}')]),
    # Llama 3.x JSON
    ("llama3", '{"name": "get_weather", "parameters": {"city": "Paris"}}', "", [("get_weather", '{"city": "Paris"}')]),
    ("llama3", '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Oslo"}}',
     "", [("get_weather", '{"city": "Oslo"}')]),
    ("llama3", '{"name": "get_weather", "parameters": {"city": "Paris"}}; {"name": "search", "parameters": {"q": "x"}}',
     "", [("get_weather", '{"city": "Paris"}'), ("search", '{"q": "x"}')]),
    ("llama3", '{"name": "Bob", "age": 3}', '{"name": "Bob", "age": 3}', []),  # not one of the tools: an answer
    ("llama3", '  {"answer": 42}', '  {"answer": 42}', []),
    ("llama3", "The answer is {not a call}.", "The answer is {not a call}.", []),
    # Mistral
    ("mistral", '[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris"}}, '
                '{"name": "search", "arguments": {"q": "x"}}]',
     "", [("get_weather", '{"city": "Paris"}'), ("search", '{"q": "x"}')]),
    ("mistral", '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}[TOOL_CALLS]search[ARGS]{"q": "y"}',
     "", [("get_weather", '{"city": "Paris"}'), ("search", '{"q": "y"}')]),
    ("mistral", "[TOOL_CALLS] nonsense!", "[TOOL_CALLS] nonsense!", []),
    # auto: whichever format's opener comes first
    ("auto", 'Sure. <tool_call>{"name": "search", "arguments": {"q": "x"}}</tool_call>', "Sure.", [("search", '{"q": "x"}')]),
    ("auto", '[TOOL_CALLS][{"name": "search", "arguments": {"q": "x"}}]', "", [("search", '{"q": "x"}')]),
    ("auto", '{"name": "search", "parameters": {"q": "x"}}', "", [("search", '{"q": "x"}')]),
    ("auto", "Just words, 2 < 3 and [brackets].", "Just words, 2 < 3 and [brackets].", []),
]


def _result(stream):
    return stream.text, [(c.name, c.arguments) for c in stream.calls]


def _pieces(text, rng):
    cuts = sorted(rng.sample(range(1, len(text)), min(len(text) - 1, rng.randint(1, 12)))) if len(text) > 1 else []
    return [text[a:b] for a, b in zip([0] + cuts, cuts + [len(text)])]


@pytest.mark.parametrize("parser,text,content,calls", CASES)
def test_whole_text(parser, text, content, calls):
    got_content, got_calls = parse(tool_stream(parser, TOOLS), text)
    assert got_content == content
    assert [(c.name, c.arguments) for c in got_calls] == calls
    for c in got_calls:
        json.loads(c.arguments)  # the raw arguments text is the model's JSON
        assert c.id.startswith("call_") and len(c.id) > 20
    assert len({c.id for c in got_calls}) == len(got_calls)


@pytest.mark.parametrize("parser,text,content,calls", CASES)
def test_streamed_in_any_pieces_assembles_to_the_whole(parser, text, content, calls):
    rng = random.Random(text)
    splits = [list(text)] + [_pieces(text, rng) for _ in range(20)]
    for pieces in splits:
        s = tool_stream(parser, TOOLS)
        events = [ev for p in pieces for ev in s.feed(p)] + s.finish()
        # What the events say, assembled the way a client does, equals the parse.
        streamed_content = "".join(ev.text for ev in events if isinstance(ev, Content))
        names = {ev.index: ev.name for ev in events if isinstance(ev, CallStart)}
        args: dict[int, str] = {}
        for ev in events:
            if isinstance(ev, ArgsDelta):
                assert ev.index in names  # arguments only ever follow their call's start
                args[ev.index] = args.get(ev.index, "") + ev.text
        assert streamed_content == content
        assert [(names[i], args.get(i, "")) for i in sorted(names)] == calls
        assert _result(s) == (content, calls)


def test_arguments_stream_while_they_are_written():
    s = tool_stream("hermes", TOOLS)
    head = '<tool_call>\n{"name": "search", "arguments": {"q": "long'
    events = s.feed(head)
    assert [type(e) for e in events] == [CallStart, ArgsDelta]
    assert events[1].text == '{"q": "long'
    assert s.feed(" query")[0].text == " query"
    assert [e.text for e in s.feed('"}}\n</tool_call>')] == ['"}']


def test_text_is_held_only_while_it_may_open_a_call():
    s = tool_stream("hermes", TOOLS)
    assert s.feed("Hello <tool") == [Content("Hello")]   # " <tool" may begin "<tool_call>"
    assert s.feed("s are nice") == [Content(" <tools are nice")]
    assert s.finish() == []


def test_a_call_cut_off_by_max_tokens_keeps_what_was_written():
    content, calls = parse(tool_stream("hermes", TOOLS), '<tool_call>{"name": "search", "arguments": {"q": "ab')
    assert content == "" and [(c.name, c.arguments) for c in calls] == [("search", '{"q": "ab')]


def test_a_name_still_being_written_is_not_a_call_yet():
    s = tool_stream("hermes", TOOLS)
    assert s.feed('<tool_call>{"name": "sea') == []
    assert "".join(e.text for e in s.finish()) == '<tool_call>{"name": "sea'  # never finished: it was text
    assert s.calls == []


@pytest.mark.parametrize("required,text,calls", [
    (False, '{"name": "get_weather", "arguments": {"city": "Paris"}}', [("get_weather", '{"city": "Paris"}')]),
    (True, '[{"name": "get_weather", "arguments": {"city": "Paris"}}, {"name": "search", "arguments": {"q": "x"}}]',
     [("get_weather", '{"city": "Paris"}'), ("search", '{"q": "x"}')]),
    (True, '[{"name":"search","arguments":{}}]', [("search", "{}")]),
])
def test_forced_call_json(required, text, calls):
    for pieces in ([text], list(text)):
        s = forced_stream(required, TOOLS)
        for p in pieces:
            s.feed(p)
        s.finish()
        assert _result(s) == ("", calls)


def test_unknown_parser_name_is_refused():
    with pytest.raises(ValueError, match="unknown tool parser"):
        tool_stream("gpt", TOOLS)
