"""Structured-output and logit-shaping parameters of OpenAI and vLLM request bodies,
and the refusal of generation-changing parameters the gateway does not implement.

OpenAI's names: ``response_format`` (``text`` | ``json_object`` | ``json_schema``
with ``name``, ``schema``, ``strict``), ``logit_bias``. vLLM's extras (through the
openai client's ``extra_body``): ``guided_json``, ``guided_regex``, ``guided_choice``,
``guided_grammar`` (Lark, or GBNF which is converted), ``structured_outputs`` (the
wire's own ``StructuredOutputs`` fields), ``min_tokens``. At most one constraint per
request; every one becomes ``SamplingParams.structured_outputs`` and is compiled
(validated) here, so a schema the worker could not use is a 400, not a queued job.
"""
from __future__ import annotations

import re
from typing import Any, Literal, Optional, Union

import llguidance
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from inferq.schemas import StructuredOutputs
from inferq.producer.gateway.errors import bad_request

# Fields that change what is generated and that this gateway does not implement: a
# request naming one is refused (400) instead of being answered as if it were absent.
# Each maps to why, so the message can say what to do instead.
UNSUPPORTED = {
    "functions": "the legacy 'functions' parameter is not supported; use 'tools'",
    "function_call": "the legacy 'function_call' parameter is not supported; use 'tool_choice'",
    "prediction": "predicted outputs ('prediction') are not supported",
    "audio": "audio output is not supported",
    "web_search_options": "web search is not supported",
    "use_beam_search": "beam search is not supported",
    "length_penalty": "length_penalty applies to beam search, which is not supported",
    "logits_processors": "custom logits processors are not supported",
    "guided_whitespace_pattern": "guided_whitespace_pattern is not supported",
    "structural_tag": "structural tags are not supported",
    # A declared field of /v1/completions requests, so only chat requests get here.
    "best_of": "best_of is not a chat completions parameter (it is one of /v1/completions): use n",
}
# Values of those fields that mean "off" (accepted: they change nothing).
_NEUTRAL = {"use_beam_search": (False, None), "length_penalty": (1.0, 1, None), "logits_processors": (None, []),
            "functions": (None, []), "function_call": (None, "none"), "prediction": (None,), "audio": (None,),
            "web_search_options": (None,), "guided_whitespace_pattern": (None,), "structural_tag": (None,),
            "best_of": (None, 1)}

_NAME_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


def refuse_unsupported(body: Any) -> None:
    """A 400 naming the first unimplemented generation-changing field set in ``body``."""
    if not isinstance(body, dict):
        return
    for name, why in UNSUPPORTED.items():
        if name in body and body[name] not in _NEUTRAL.get(name, (None,)):
            raise bad_request(why, param=name, code="unsupported_parameter")
    modalities = body.get("modalities")
    if modalities not in (None, ["text"]):
        raise bad_request("only text output is supported ('modalities': ['text'])", param="modalities",
                          code="unsupported_parameter")


class JsonSchemaFormat(BaseModel):
    model_config = ConfigDict(extra="ignore", populate_by_name=True)
    name: str = "response"
    description: Optional[str] = None
    schema_: Optional[Union[dict[str, Any], bool]] = Field(None, alias="schema")
    strict: Optional[bool] = None


class ResponseFormat(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: Literal["text", "json_object", "json_schema"]
    json_schema: Optional[JsonSchemaFormat] = None


class StructuredFields(BaseModel):
    """Mixed into the gateway's completion and chat request models."""

    response_format: Optional[ResponseFormat] = None
    guided_json: Optional[Union[dict[str, Any], str, bool]] = None
    guided_regex: Optional[str] = None
    guided_choice: Optional[list[str]] = None
    guided_grammar: Optional[str] = None
    structured_outputs: Optional[dict[str, Any]] = None
    guided_decoding_backend: Optional[str] = None  # vLLM's; one backend here (llguidance), so it changes nothing
    logit_bias: Optional[dict[str, float]] = None
    min_tokens: Optional[int] = Field(None, ge=0)

    def constraint(self) -> Optional[StructuredOutputs]:
        """The request's one constraint (None: free text). A 400 if it is ill-formed,
        does not compile, or several are given."""
        given: list[tuple[str, dict]] = []
        rf = self.response_format
        if rf is not None and rf.type != "text":
            if rf.type == "json_object":
                given.append(("response_format", {"json_object": True}))
            else:
                js = rf.json_schema
                if js is None or js.schema_ is None:
                    raise bad_request("response_format of type json_schema needs json_schema.schema",
                                      param="response_format")
                if not _NAME_RE.match(js.name):
                    raise bad_request("response_format.json_schema.name must be 1-64 letters, digits, '_' or '-'",
                                      param="response_format")
                given.append(("response_format", {"json": js.schema_}))
        if self.guided_json is not None:
            given.append(("guided_json", {"json": self.guided_json}))
        if self.guided_regex is not None:
            given.append(("guided_regex", {"regex": self.guided_regex}))
        if self.guided_choice is not None:
            given.append(("guided_choice", {"choice": self.guided_choice}))
        if self.guided_grammar is not None:
            given.append(("guided_grammar", {"grammar": as_lark(self.guided_grammar)}))
        if self.structured_outputs is not None:
            so = dict(self.structured_outputs)
            if isinstance(so.get("grammar"), str):
                so["grammar"] = as_lark(so["grammar"])
            given.append(("structured_outputs", so))
        if not given:
            return None
        if len(given) > 1:
            raise bad_request("give at most one of response_format (json_object/json_schema), guided_json, guided_regex, "
                              f"guided_choice, guided_grammar and structured_outputs; got {', '.join(n for n, _ in given)}",
                              param=given[1][0])
        param, fields = given[0]
        try:
            return StructuredOutputs.model_validate(fields)
        except ValidationError as e:
            msgs = "; ".join(err["msg"].removeprefix("Value error, ") for err in e.errors()[:3])
            raise bad_request(f"{param}: {msgs}", param=param, code="invalid_constraint") from None

    def logit_bias_ids(self) -> Optional[dict[int, float]]:
        """OpenAI sends logit_bias keys as strings of token ids."""
        if not self.logit_bias:
            return None
        out = {}
        for k, v in self.logit_bias.items():
            try:
                out[int(k)] = float(v)
            except (TypeError, ValueError):
                raise bad_request(f"logit_bias keys must be token ids; got {k!r}", param="logit_bias") from None
        return out

    def shaping_fields(self) -> dict[str, Any]:
        """The SamplingParams fields these parameters set."""
        refuse_unsupported(self.model_extra)  # the request models keep unknown fields there
        fields: dict[str, Any] = {}
        constraint = self.constraint()
        if constraint is not None:
            fields["structured_outputs"] = constraint
        bias = self.logit_bias_ids()
        if bias:
            fields["logit_bias"] = bias
        if self.min_tokens:
            fields["min_tokens"] = self.min_tokens
        return fields


def as_lark(grammar: str) -> str:
    """vLLM's guided_grammar takes Lark or GBNF (llama.cpp's); the wire carries Lark."""
    if "::=" in grammar:
        try:
            return llguidance.gbnf_to_lark.gbnf_to_lark(grammar)
        except Exception as e:
            raise bad_request(f"guided_grammar: the GBNF grammar cannot be read: {e}", param="guided_grammar",
                              code="invalid_constraint") from None
    return grammar
