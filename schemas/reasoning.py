"""Reasoning kept apart from the answer: what a thinking model writes inside
``<think>…</think>`` becomes ``reasoning_content``, the rest ``content`` (vLLM's
``--reasoning-parser``, llama.cpp's ``--reasoning-format``).

Two families, named as vLLM names them:

* ``qwen3``: the block is optional and, when present, opens the output (Qwen3
  hybrid models, QwQ). With thinking disabled (``chat_template_kwargs:
  {"enable_thinking": false}``) the template closes an empty block in the prompt
  and the whole output is the answer.
* ``deepseek_r1``: the template opens ``<think>`` in the prompt, so the output
  starts inside the reasoning and ``</think>`` ends it; an output that never
  closes the block (cut off while thinking) is all reasoning. A ``<think>`` the
  model writes anyway is dropped. Also right for templates of other families that
  pre-fill ``<think>`` (Qwen3 "Thinking-2507"); detection picks it for them.

Pure text logic, no tokenizer: the gateway splits streamed text deltas with
``ReasoningSplitter`` (tags may arrive split across deltas), whole texts with
``split_reasoning``; the worker names a model's family with ``detect_parser``.
Whitespace around the block (the template's ``\\n\\n`` separators) is trimmed:
reasoning has no leading or trailing whitespace, content no leading whitespace
after a block.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

THINK_START = "<think>"
THINK_END = "</think>"


@dataclass(frozen=True)
class ReasoningFormat:
    name: str
    # The template opens the block in the prompt: the output starts inside it.
    starts_inside: bool
    start: str = THINK_START
    end: str = THINK_END


PARSERS: dict[str, ReasoningFormat] = {
    "qwen3": ReasoningFormat("qwen3", starts_inside=False),
    "deepseek_r1": ReasoningFormat("deepseek_r1", starts_inside=True),
}
# Names that turn the split off.
OFF = ("", "none", "off")


def reasoning_format(name: Optional[str]) -> Optional[ReasoningFormat]:
    """The family called ``name`` (None for "", "none", "off"); ValueError for an unknown name."""
    key = (name or "").strip().lower()
    if key in OFF:
        return None
    if key not in PARSERS:
        raise ValueError(f"unknown reasoning parser {name!r}; choose from {', '.join(PARSERS)} or none")
    return PARSERS[key]


def thinking_disabled(chat_template_kwargs: Optional[dict[str, Any]]) -> bool:
    """The request asked the template not to think (Qwen3's ``enable_thinking``,
    DeepSeek V3.1's and Granite's ``thinking``): its output has no reasoning."""
    kw = chat_template_kwargs or {}
    return kw.get("enable_thinking") is False or kw.get("thinking") is False


def detect_parser(chat_template: Optional[str], generation_prompt: str = "") -> Optional[str]:
    """The family of a model from its chat template: None when the template knows
    no ``<think>``; ``deepseek_r1`` when ``generation_prompt`` (the template rendered
    for one user message with ``add_generation_prompt``) ends inside an open block;
    else ``qwen3``."""
    if not isinstance(chat_template, str) or THINK_START not in chat_template:
        return None
    tail = generation_prompt.rstrip()
    if tail.endswith(THINK_START):
        return "deepseek_r1"
    return "qwen3"


def _partial_suffix(text: str, tag: str) -> int:
    """Length of the longest end of ``text`` that is a proper start of ``tag``."""
    for n in range(min(len(text), len(tag) - 1), 0, -1):
        if tag.startswith(text[-n:]):
            return n
    return 0


class ReasoningSplitter:
    """One output's text deltas -> (reasoning delta, content delta).

    Text that might be the start of a tag is held until the next delta decides,
    so a tag split across deltas (``"</thi"`` + ``"nk>"``) never leaks into
    either side; ``finish`` releases what is still held."""

    _BEFORE, _OPENING, _REASONING, _CONTENT = range(4)

    def __init__(self, fmt: ReasoningFormat):
        self.fmt = fmt
        self._state = self._OPENING if fmt.starts_inside else self._BEFORE
        self._held = ""
        self._reasoning_ws = ""  # trailing whitespace of the reasoning so far, not yet shown
        self._reasoning_begun = False
        self._trim_content = False  # content right after a block: drop its leading whitespace
        self.saw_reasoning = fmt.starts_inside  # a block was opened (reasoning_content is not null)
        self.reasoning_ended = False

    def feed(self, text: str) -> tuple[str, str]:
        self._held += text
        reasoning, content = [], []
        while True:
            held = self._held
            if self._state in (self._BEFORE, self._OPENING):
                stripped = held.lstrip()
                if stripped.startswith(self.fmt.start):
                    self._held = stripped[len(self.fmt.start):]
                    self._state, self.saw_reasoning = self._REASONING, True
                    continue
                if self.fmt.start.startswith(stripped):  # whitespace, or a start tag still arriving
                    break
                self._state = self._REASONING if self._state == self._OPENING else self._CONTENT
                continue
            if self._state == self._REASONING:
                i = held.find(self.fmt.end)
                if i >= 0:
                    reasoning.append(self._reasoning_text(held[:i]))
                    self._reasoning_ws = ""  # whitespace before the end tag is dropped
                    self._held = held[i + len(self.fmt.end):]
                    self._state, self._trim_content, self.reasoning_ended = self._CONTENT, True, True
                    continue
                keep = _partial_suffix(held, self.fmt.end)
                reasoning.append(self._reasoning_text(held[:len(held) - keep]))
                self._held = held[len(held) - keep:]
                break
            # content
            if self._trim_content:
                held = held.lstrip()
                if not held:
                    self._held = ""
                    break
                self._trim_content = False
            content.append(held)
            self._held = ""
            break
        return "".join(reasoning), "".join(content)

    def finish(self) -> tuple[str, str]:
        """What is still held once the output has ended."""
        held, self._held = self._held, ""
        if self._state == self._BEFORE:
            self._state = self._CONTENT
            return "", held
        if self._state in (self._OPENING, self._REASONING):
            return self._reasoning_text(held).rstrip(), ""
        return "", "" if self._trim_content else held

    def _reasoning_text(self, text: str) -> str:
        if not self._reasoning_begun:
            text = text.lstrip()
            if not text:
                return ""
            self._reasoning_begun = True
        text = self._reasoning_ws + text
        body = text.rstrip()
        self._reasoning_ws = text[len(body):]
        return body


def split_reasoning(fmt: Optional[ReasoningFormat], text: str) -> tuple[Optional[str], str]:
    """A whole output -> (reasoning or None when there was no block, content);
    the same split a stream of its deltas gets."""
    if fmt is None:
        return None, text
    s = ReasoningSplitter(fmt)
    r1, c1 = s.feed(text)
    r2, c2 = s.finish()
    return (r1 + r2 if s.saw_reasoning else None), c1 + c2
