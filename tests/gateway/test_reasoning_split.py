"""The reasoning splitter (schemas/reasoning.py): whole texts, and the same texts
fed as deltas cut at every position (so every tag is split across deltas somewhere),
plus the pieces of real detokenized token streams; the gateway's setting parser and
template detection."""
from __future__ import annotations

import pytest

from inferq.producer.gateway.reasoning import ANY_MODEL, parse_setting
from inferq.schemas.reasoning import (
    PARSERS, ReasoningSplitter, detect_parser, reasoning_format, split_reasoning, thinking_disabled,
)

QWEN3, R1 = PARSERS["qwen3"], PARSERS["deepseek_r1"]

CASES = [
    # (family, output, reasoning, content)
    (QWEN3, "<think>\nLet me see.\n</think>\n\nIt is 4.", "Let me see.", "It is 4."),
    (QWEN3, "It is 4.", None, "It is 4."),
    (QWEN3, "  It is <think> not a block", None, "  It is <think> not a block"),
    (QWEN3, "\n<think>a < b and c</thin</think>done", "a < b and c</thin", "done"),
    (QWEN3, "<think>cut off while thinking", "cut off while thinking", ""),
    (QWEN3, "<think></think>{\"a\": 1}", "", "{\"a\": 1}"),
    (QWEN3, "<thi", None, "<thi"),
    (R1, "First 2+2.\n</think>\n\n4", "First 2+2.", "4"),
    (R1, "<think>\nFirst 2+2.\n</think>4", "First 2+2.", "4"),
    (R1, "</think>answer only", "", "answer only"),
    (R1, "never closed </thi", "never closed </thi", ""),
    (R1, "a\n\n\nb\n</think>\n\nc\n\nd\n", "a\n\n\nb", "c\n\nd\n"),
]


@pytest.mark.parametrize("fmt,text,reasoning,content", CASES)
def test_whole_text(fmt, text, reasoning, content):
    assert split_reasoning(fmt, text) == (reasoning, content)


@pytest.mark.parametrize("fmt,text,reasoning,content", CASES)
def test_deltas_cut_anywhere_give_the_same_split(fmt, text, reasoning, content):
    for cuts in [(i,) for i in range(1, len(text))] + [tuple(range(1, len(text)))]:
        s = ReasoningSplitter(fmt)
        got_r, got_c, start = [], [], 0
        for end in list(cuts) + [len(text)]:
            r, c = s.feed(text[start:end])
            got_r.append(r)
            got_c.append(c)
            start = end
        r, c = s.finish()
        got_r.append(r)
        got_c.append(c)
        assert ("".join(got_r) if s.saw_reasoning else None, "".join(got_c)) == (reasoning, content), cuts
        # The end tag never leaks into a delta, even split across deltas.
        assert not any("</think>" in piece for piece in got_r + got_c)


def test_content_is_sent_as_soon_as_the_block_ends():
    s = ReasoningSplitter(QWEN3)
    assert s.feed("<think>plan") == ("plan", "")
    assert s.feed(" more</th") == (" more", "")  # "</th" held: it may be the end tag
    assert s.feed("ink>\n\nAns") == ("", "Ans")
    assert s.reasoning_ended
    assert s.feed("wer") == ("", "wer")
    assert s.finish() == ("", "")


def test_detokenized_token_stream(tmp_path):
    """The pieces a real incremental detokenizer gives for a scripted token stream of
    the tiny thinking model (<think>/</think> single tokens, as in Qwen3)."""
    from transformers import AutoTokenizer

    from tests.reasoning_models import QWEN3_TEMPLATE, save_thinking_model

    folder = save_thinking_model(tmp_path / "m", QWEN3_TEMPLATE)
    tok = AutoTokenizer.from_pretrained(folder)
    text = "<think>\nThe user greets; answer kindly.\n</think>\n\nHello! How can I help?"
    ids = tok.encode(text, add_special_tokens=False)
    s = ReasoningSplitter(QWEN3)
    shown, rs, cs = "", [], []
    for i in range(1, len(ids) + 1):  # the text each token adds, as the worker publishes it
        now = tok.decode(ids[:i])
        r, c = s.feed(now[len(shown):])
        shown = now
        rs.append(r)
        cs.append(c)
    r, c = s.finish()
    assert ("".join(rs) + r, "".join(cs) + c) == ("The user greets; answer kindly.", "Hello! How can I help?")


def test_names_and_settings():
    assert reasoning_format("Qwen3") is QWEN3 and reasoning_format("none") is None and reasoning_format("") is None
    with pytest.raises(ValueError, match="unknown reasoning parser"):
        reasoning_format("granite")
    assert parse_setting("qwen3") == {ANY_MODEL: QWEN3}
    assert parse_setting("a=qwen3, org/b=deepseek_r1,c=none") == {"a": QWEN3, "org/b": R1, "c": None}
    with pytest.raises(ValueError):
        parse_setting("a=thinky")
    assert thinking_disabled({"enable_thinking": False}) and not thinking_disabled({"enable_thinking": True})
    assert not thinking_disabled(None)


def test_detection_from_the_template():
    from tests.reasoning_models import QWEN3_TEMPLATE, R1_TEMPLATE

    assert detect_parser("{{ messages }}", "") is None
    assert detect_parser(QWEN3_TEMPLATE, "<|im_start|>assistant\n") == "qwen3"
    assert detect_parser(R1_TEMPLATE, "<|im_start|>assistant\n<think>\n") == "deepseek_r1"


def test_sdk_jobs_carry_chat_template_kwargs():
    from inferq.producer.client import build_job

    ask = [{"role": "user", "content": "hi"}]
    job = build_job("m", messages=ask, chat_template_kwargs={"enable_thinking": False})
    assert job.chat_template_kwargs == {"enable_thinking": False}
    assert '"enable_thinking":false' in job.to_fields()["job"]
    with pytest.raises(ValueError, match="may not set chat_template, tokenize"):
        build_job("m", messages=ask, chat_template_kwargs={"tokenize": True, "chat_template": "x"})
    with pytest.raises(ValueError, match="need 'messages'"):
        build_job("m", "a prompt", chat_template_kwargs={"enable_thinking": False})
