"""The worker renders tools and tool turns: through a template that reads
``tools`` (the shapes HF templates expect), or the Hermes-style fallback for the
bundled SmolLM2 template, which has no tool support. Real tokenizer, no model."""
import copy
import json

import pytest

from inferq.gpuworker.service.prompts import PromptBuilder, template_call_id
from inferq.schemas import Job

TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                                           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]
TURNS = [
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": "", "tool_calls": [
        {"id": "call_abcdefghijklmnop", "type": "function",
         "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
    {"role": "tool", "content": "18C, sunny", "tool_call_id": "call_abcdefghijklmnop"},
]
# A tool-aware template of the usual kind: tools as JSON, arguments through tojson
# (a mapping, as Qwen's and Llama's templates need), ids checked like Mistral's.
TOOL_TEMPLATE = (
    "{% if tools %}TOOLS:{% for t in tools %}{{ t.function.name }};{% endfor %}\n{% endif %}"
    "{% for m in messages %}"
    "{% if m.tool_calls %}{% for c in m.tool_calls %}"
    "{% if c.id|length != 9 %}{{ raise_exception('ids must be 9 characters') }}{% endif %}"
    "CALL {{ c.id }} {{ c.function.name }} {{ c.function.arguments.city }} {{ c.function.arguments|tojson }}\n"
    "{% endfor %}{% elif m.role == 'tool' %}RESULT {{ m.tool_call_id }}: {{ m.content }}\n"
    "{% else %}{{ m.role }}: {{ m.content }}\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)


@pytest.fixture(scope="module")
def tokenizer():
    from inferq.gpuworker.models.loader import bundled_model_path, converted_folder, load_tokenizer

    return load_tokenizer(converted_folder(bundled_model_path()))


def render(tok, **job):
    ids = PromptBuilder(tok, 4096, 49152).token_ids(Job(model="m", **job))
    return tok.decode(ids)


def test_template_with_tools_gets_them_and_tool_turns_as_mappings(tokenizer):
    tok = copy.deepcopy(tokenizer)
    tok.chat_template = TOOL_TEMPLATE
    text = render(tok, messages=TURNS, tools=TOOLS)
    short = template_call_id("call_abcdefghijklmnop")
    assert len(short) == 9 and short.isalnum()
    assert text.startswith("TOOLS:get_weather;")  # the template gets the tools
    assert f"CALL {short} get_weather Paris " + json.dumps({"city": "Paris"}) in text
    assert f"RESULT {short}: 18C, sunny" in text  # the answer maps to its call's id
    assert text.endswith("assistant:")


def test_template_without_tools_gets_the_fallback_block_and_text_turns(tokenizer):
    text = render(tokenizer, messages=TURNS, tools=TOOLS)
    system = text.split("<|im_end|>")[0]
    assert "<tools>" in system and json.dumps(TOOLS[0]) in system and "<tool_call>" in system
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>' in text
    assert "<|im_start|>user\n<tool_response>\n18C, sunny\n</tool_response>" in text
    # Without tools (tool_choice "none") the turns still render, and no tools block.
    plain = render(tokenizer, messages=TURNS)
    assert "<tools>" not in plain and "<tool_response>" in plain


def test_plain_chat_renders_as_before(tokenizer):
    msgs = [{"role": "user", "content": "Hi"}]
    want = tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    assert render(tokenizer, messages=msgs) == want
