"""Tool calling on the chat route: the request's ``tools``/``tool_choice`` become
job fields (tools the worker renders with the chat template; for a forced call a
JSON Schema the engine enforces), and the job's text becomes ``tool_calls``.

``auto``: the model writes freely and a family parser (tool_parsers, chosen by
INFERQ_GATEWAY_TOOL_PARSER) finds the calls. ``required`` or a named function:
the grammar makes the answer a JSON call (an object, or an array of them), so
even a small model emits a valid call, and it parses the same for every family.
``none``: the tools are not rendered and nothing is parsed.
"""
from __future__ import annotations

import json
from typing import Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field

from inferq.schemas import SamplingParams
from inferq.schemas.job import MAX_TOOLS
from inferq.schemas.structured import StructuredOutputs
from inferq.producer.gateway.errors import bad_request
from inferq.producer.gateway.tool_parsers import (
    NEEDS_SPECIAL_TOKENS, ArgsDelta, CallStart, Content, Event, ToolCallStream, forced_stream, parse, tool_stream,
)

# A function without parameters takes none (not "any object": a model would ramble).
NO_PARAMETERS = {"type": "object", "properties": {}, "additionalProperties": False}


# -- request models (openai_schemas.py uses them) ------------------------------------
class FunctionDef(BaseModel):
    model_config = ConfigDict(extra="ignore")
    name: str = Field(pattern=r"^[a-zA-Z0-9_-]{1,64}$")
    description: Optional[str] = Field(None, max_length=16_384)
    parameters: Optional[dict[str, Any]] = None
    strict: Optional[bool] = None


class ToolDef(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: Literal["function"]
    function: FunctionDef


class _Named(BaseModel):
    model_config = ConfigDict(extra="ignore")
    name: str = Field(min_length=1, max_length=64)


class NamedToolChoice(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: Literal["function"]
    function: _Named


ToolChoice = Union[Literal["none", "auto", "required"], NamedToolChoice]


class FunctionCallIn(BaseModel):
    model_config = ConfigDict(extra="ignore")
    name: str = Field(min_length=1, max_length=64)
    arguments: Union[str, dict[str, Any]] = "{}"


class ToolCallIn(BaseModel):
    """An earlier assistant turn's call, sent back in ``messages``."""

    model_config = ConfigDict(extra="ignore")
    id: str = Field(min_length=1, max_length=256)
    type: Literal["function"] = "function"
    function: FunctionCallIn

    def job_dict(self) -> dict:
        args = self.function.arguments
        return {"id": self.id, "type": "function",
                "function": {"name": self.function.name,
                             "arguments": args if isinstance(args, str) else json.dumps(args)}}


# -- request -> job --------------------------------------------------------------------
class ToolPlan:
    """What one request's tool fields mean for its job and its answer."""

    def __init__(self, tools: list[ToolDef], choice: ToolChoice, parallel: bool, parser: str):
        self.tools = tools
        self.names = [t.function.name for t in tools]
        self.parallel = parallel
        self.parser = parser
        self.forced: Optional[str] = None  # "required" | "named"
        self.constraint: Optional[StructuredOutputs] = None
        if choice == "required":
            self.forced = "required"
            self.constraint = _structured(_required_schema([t.function for t in tools], parallel), "tools")
        elif isinstance(choice, NamedToolChoice):
            fn = next((t.function for t in tools if t.function.name == choice.function.name), None)
            if fn is None:
                raise bad_request(f"tool_choice names the function '{choice.function.name}', which is not in tools "
                                  f"({', '.join(self.names)})", param="tool_choice")
            self.forced = "named"
            self.constraint = _structured(_with_defs([fn], lambda: _call_schema(fn)), "tools")

    def job_tools(self) -> list[dict]:
        return [t.model_dump(exclude_none=True) for t in self.tools]

    def sampling(self, sampling: SamplingParams) -> SamplingParams:
        if self.forced:
            if sampling.structured_outputs is not None:
                raise bad_request(f"tool_choice '{self.forced}' forces the answer's format; it cannot be combined "
                                  "with response_format or another structured-output constraint", param="tool_choice")
            return sampling.model_copy(update={"structured_outputs": self.constraint})
        if self.parser in NEEDS_SPECIAL_TOKENS:  # the opener may be a special token ([TOOL_CALLS], <|python_tag|>)
            return sampling.model_copy(update={"skip_special_tokens": False})
        return sampling

    def new_stream(self) -> ToolCallStream:
        if self.forced:
            return forced_stream(self.forced == "required", self.names)
        return tool_stream(self.parser, self.names)

    @property
    def max_calls(self) -> Optional[int]:
        return None if self.parallel else 1

    def finish_reason(self, engine_reason: Optional[str], called: bool) -> Optional[str]:
        # A call cut off by max_tokens stays "length", as OpenAI reports it.
        return "tool_calls" if called and engine_reason == "stop" else engine_reason

    def shape_body(self, body: dict) -> dict:
        """A non-streamed chat body: each choice's text becomes content and tool_calls."""
        for choice in body["choices"]:
            message = choice["message"]
            content, calls = parse(self.new_stream(), message.get("content") or "")
            calls = calls[:self.max_calls] if self.max_calls else calls
            if calls:
                message["content"] = content or None
                message["tool_calls"] = [c.body() for c in calls]
            else:
                message["content"] = content
            choice["finish_reason"] = self.finish_reason(choice["finish_reason"], bool(calls))
        return body

    def deltas(self) -> "ToolDeltas":
        return ToolDeltas(self)


def plan_tools(tools: Optional[list[ToolDef]], choice: Optional[ToolChoice], parallel: bool,
               parser: str) -> Optional[ToolPlan]:
    """None when the request has no tools to render (none given, or tool_choice "none")."""
    if not tools:
        if choice not in (None, "none", "auto"):
            raise bad_request("tool_choice needs tools", param="tool_choice")
        return None
    if len(tools) > MAX_TOOLS:
        raise bad_request(f"at most {MAX_TOOLS} tools are accepted", param="tools")
    seen = set()
    for i, t in enumerate(tools):
        if t.function.name in seen:
            raise bad_request(f"two tools are named '{t.function.name}'", param=f"tools.{i}.function.name")
        seen.add(t.function.name)
        if t.function.parameters is not None:
            _structured(t.function.parameters, f"tools.{i}.function.parameters")
    if choice == "none":
        return None
    return ToolPlan(tools, choice or "auto", parallel, parser)


def _structured(schema: dict, param: str) -> StructuredOutputs:
    try:
        return StructuredOutputs(json_schema=schema)
    except ValueError as e:
        problem = "; ".join(err["msg"].removeprefix("Value error, ") for err in getattr(e, "errors", list)()) or str(e)
        raise bad_request(f"{param}: not a JSON Schema the decoder can enforce: {problem}", param=param) from None


def _call_schema(fn: FunctionDef) -> dict:
    params = {k: v for k, v in (fn.parameters or NO_PARAMETERS).items() if k not in _DEFS_KEYS}
    return {"type": "object", "properties": {"name": {"const": fn.name}, "arguments": params},
            "required": ["name", "arguments"], "additionalProperties": False}


def _required_schema(fns: list[FunctionDef], parallel: bool) -> dict:
    def build():
        one = _call_schema(fns[0]) if len(fns) == 1 else {"anyOf": [_call_schema(f) for f in fns]}
        schema = {"type": "array", "items": one, "minItems": 1}
        if not parallel:
            schema["maxItems"] = 1
        return schema
    return _with_defs(fns, build)


_DEFS_KEYS = ("$defs", "definitions")


def _with_defs(fns: list[FunctionDef], build) -> dict:
    """``$ref: "#/$defs/X"`` in a function's parameters points at the root of the
    schema, which is now the call's: its definitions move to the root."""
    schema = build()
    for key in _DEFS_KEYS:
        merged: dict = {}
        for fn in fns:
            for name, d in ((fn.parameters or {}).get(key) or {}).items():
                if name in merged and merged[name] != d:
                    raise bad_request(f"two tools define {key}/{name} differently; a forced tool_choice needs "
                                      "definitions that agree", param="tools")
                merged[name] = d
        if merged:
            schema[key] = merged
    return schema


# -- job output -> streamed deltas ------------------------------------------------------
class ToolDeltas:
    """One choice's streamed text as chat deltas: ``content`` pieces and
    ``tool_calls`` fragments (index, id, type, name, then argument pieces),
    which the OpenAI SDKs assemble into the non-streamed message."""

    def __init__(self, plan: ToolPlan):
        self.plan = plan
        self.stream = plan.new_stream()
        self.called = False

    def feed(self, text: str) -> list[dict]:
        return self._deltas(self.stream.feed(text))

    def finish(self) -> list[dict]:
        return self._deltas(self.stream.finish())

    def finish_reason(self, engine_reason: Optional[str]) -> Optional[str]:
        return self.plan.finish_reason(engine_reason, self.called)

    def _deltas(self, events: list[Event]) -> list[dict]:
        limit = self.plan.max_calls
        out: list[dict] = []
        for ev in events:
            if isinstance(ev, Content):
                if out and "content" in out[-1]:
                    out[-1]["content"] += ev.text
                else:
                    out.append({"content": ev.text})
                continue
            if limit is not None and ev.index >= limit:
                continue
            if isinstance(ev, CallStart):
                self.called = True
                out.append({"tool_calls": [{"index": ev.index, "id": ev.id, "type": "function",
                                            "function": {"name": ev.name, "arguments": ""}}]})
            elif isinstance(ev, ArgsDelta):
                last = out[-1]["tool_calls"][0] if out and "tool_calls" in out[-1] else None
                if last is not None and last["index"] == ev.index:
                    last["function"]["arguments"] = last["function"].get("arguments", "") + ev.text
                else:
                    out.append({"tool_calls": [{"index": ev.index, "function": {"arguments": ev.text}}]})
        return out
