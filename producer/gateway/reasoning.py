"""Reasoning kept apart from the answer on the chat route (vLLM's ``--reasoning-parser``):
which family a served model has, and the response bodies and stream deltas with
``reasoning_content`` beside ``content``.

A model's family comes from INFERQ_GATEWAY_REASONING_PARSER when it names one for
the model (or for every model), else from what its workers published when they
detected it from the chat template (``keys.model_info``). A request that turns
thinking off (``chat_template_kwargs: {"enable_thinking": false}``) has no reasoning
to split. The split itself is ``inferq.schemas.reasoning`` (pure text logic, shared
with the SDK).
"""
from __future__ import annotations

import time
from typing import Any, Optional

from inferq.schemas import keys
from inferq.schemas.reasoning import (
    ReasoningFormat, ReasoningSplitter, reasoning_format, split_reasoning, thinking_disabled,
)
from inferq.schemas.text import as_str

ANY_MODEL = "*"
# Seconds a model's published family is trusted before it is read again.
_PUBLISHED_TTL_S = 5.0


def parse_setting(value: str) -> dict[str, Optional[ReasoningFormat]]:
    """``"qwen3"`` -> every model; ``"a=qwen3,b=none"`` -> per model. ValueError names a bad entry."""
    out: dict[str, Optional[ReasoningFormat]] = {}
    for entry in (value or "").split(","):
        entry = entry.strip()
        if not entry:
            continue
        model, sep, name = entry.rpartition("=")
        if sep and not model.strip():
            raise ValueError(f"reasoning_parser entry {entry!r} names no model")
        out[model.strip() if sep else ANY_MODEL] = reasoning_format(name)
    return out


class ReasoningFamilies:
    """The family of each model, for one gateway (settings first, then what workers published)."""

    def __init__(self, setting: str, redis):
        self.configured = parse_setting(setting)
        self.redis = redis
        self._published: dict[str, tuple[float, Optional[ReasoningFormat]]] = {}

    async def of(self, model: str) -> Optional[ReasoningFormat]:
        if model in self.configured:
            return self.configured[model]
        if ANY_MODEL in self.configured:
            return self.configured[ANY_MODEL]
        at, fmt = self._published.get(model, (0.0, None))
        if time.monotonic() - at < _PUBLISHED_TTL_S:
            return fmt
        try:
            raw = await self.redis.hget(keys.model_info(model), "reasoning_parser")
            fmt = reasoning_format(as_str(raw)) if raw is not None else None
        except ValueError:  # a family this gateway does not know (a newer worker): no split
            fmt = None
        if len(self._published) > 4096:  # bounded: names come from requests that resolved
            self._published.clear()
        self._published[model] = (time.monotonic(), fmt)
        return fmt

    async def for_request(self, model: str, chat_template_kwargs: Optional[dict[str, Any]]) -> Optional[ReasoningFormat]:
        if thinking_disabled(chat_template_kwargs):
            return None
        return await self.of(model)


def shape_chat_body(body: dict, fmt: ReasoningFormat) -> dict:
    """A non-streamed chat body: each choice's think block moves to ``reasoning_content``."""
    for choice in body["choices"]:
        message = choice["message"]
        reasoning, content = split_reasoning(fmt, message.get("content") or "")
        message["content"] = content
        message["reasoning_content"] = reasoning
    return body


class ReasoningDeltas:
    """Streamed text of each choice -> (reasoning delta, content delta)."""

    def __init__(self, fmt: ReasoningFormat):
        self.fmt = fmt
        self._splitters: dict[int, ReasoningSplitter] = {}

    def _of(self, index: int) -> ReasoningSplitter:
        s = self._splitters.get(index)
        if s is None:
            s = self._splitters[index] = ReasoningSplitter(self.fmt)
        return s

    def feed(self, text: str, index: int = 0) -> tuple[str, str]:
        return self._of(index).feed(text)

    def finish(self, index: int = 0) -> tuple[str, str]:
        return self._of(index).finish()


def families(ctx) -> ReasoningFamilies:
    """The gateway's ReasoningFamilies (``ctx``: runner.Context), made on first use."""
    if ctx.reasoning is None:
        ctx.reasoning = ReasoningFamilies(ctx.settings.reasoning_parser, ctx.backend.redis)
    return ctx.reasoning
