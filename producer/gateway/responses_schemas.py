"""Request bodies of OpenAI's Responses API (``POST /v1/responses``) as the gateway reads them.

Fields that would change what is generated and that the gateway cannot honour
(built-in tools, image/file/audio inputs, reasoning effort, prompt templates,
conversations, truncation "auto", logprobs, ...) are refused with a 400 naming
them (``refuse_unsupported``); fields that change nothing (``user``,
``prompt_cache_key``, ``safety_identifier``, ``stream_options``) are accepted.
"""
from __future__ import annotations

from typing import Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, field_validator

from inferq.producer.gateway.errors import bad_request


class ResponseTextFormat(BaseModel):
    """``text.format``: ``{"type": "text"}``, ``{"type": "json_object"}`` or
    ``{"type": "json_schema", "name", "schema", "strict", "description"}`` (flat,
    unlike chat's ``response_format.json_schema``)."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True)
    type: Literal["text", "json_object", "json_schema"] = "text"
    name: Optional[str] = None
    schema_: Optional[Union[dict[str, Any], bool]] = Field(None, alias="schema")
    strict: Optional[bool] = None
    description: Optional[str] = None

    def echo(self) -> dict:
        if self.type != "json_schema":
            return {"type": self.type}
        out: dict = {"type": "json_schema", "name": self.name or "response", "schema": self.schema_,
                     "strict": self.strict}
        if self.description is not None:
            out["description"] = self.description
        return out


class ResponseText(BaseModel):
    model_config = ConfigDict(extra="allow")
    format: Optional[ResponseTextFormat] = None
    verbosity: Optional[str] = None


class FunctionTool(BaseModel):
    """A Responses function tool: flat ``{"type": "function", "name", "description", "parameters", "strict"}``."""

    model_config = ConfigDict(extra="ignore")
    type: str
    name: Optional[str] = None
    description: Optional[str] = None
    parameters: Optional[dict[str, Any]] = None
    strict: Optional[bool] = None

    def echo(self) -> dict:
        """As OpenAI echoes a function tool in the response object."""
        return {"type": "function", "name": self.name, "description": self.description,
                "parameters": self.parameters, "strict": self.strict}


class ResponseRequest(BaseModel):
    # Unknown fields are kept so refuse_unsupported can name the ones that matter.
    model_config = ConfigDict(extra="allow")

    model: Optional[str] = Field(None, max_length=256)
    input: Union[str, list[dict[str, Any]], None] = None
    instructions: Optional[str] = None
    previous_response_id: Optional[str] = Field(None, max_length=200)
    max_output_tokens: Optional[int] = Field(None, ge=1)
    temperature: Optional[float] = Field(None, ge=0.0, le=2.0)
    top_p: Optional[float] = Field(None, gt=0.0, le=1.0)
    seed: Optional[int] = Field(None, ge=0, lt=2**63)  # an extension (extra_body), as on chat
    text: Optional[ResponseText] = None
    tools: Optional[list[FunctionTool]] = None
    tool_choice: Union[str, dict[str, Any], None] = None
    parallel_tool_calls: Optional[bool] = None
    store: Optional[bool] = None
    background: Optional[bool] = None
    stream: Optional[bool] = None
    metadata: Optional[dict[str, str]] = None  # OpenAI's limits: 16 pairs, keys <= 64, values <= 512 characters
    user: Optional[str] = None
    service_tier: Optional[Literal["auto", "default", "flex", "priority"]] = None
    # inferq extensions (extra_body), as on chat completions.
    ignore_eos: Optional[bool] = None
    priority: int = Field(0, ge=-1000, le=1000)
    session_id: Optional[str] = Field(None, min_length=1, max_length=256)


    @field_validator("metadata")
    @classmethod
    def _metadata_limits(cls, v: Optional[dict[str, str]]) -> Optional[dict[str, str]]:
        if v is not None and (len(v) > 16 or any(len(k) > 64 or len(x) > 512 for k, x in v.items())):
            raise ValueError("metadata takes at most 16 pairs, keys of at most 64 and values of at most 512 characters")
        return v


# name -> (values that change nothing, why it is refused otherwise)
_UNSUPPORTED: dict[str, tuple[tuple, str]] = {
    "reasoning": ((None, {}, {"effort": None}, {"effort": None, "summary": None}),
                  "reasoning options are not supported by this gateway (the served models' reasoning cannot be steered)"),
    "include": ((None, []), "'include' is not supported (no logprobs, search results or encrypted reasoning to add)"),
    "prompt": ((None,), "prompt templates ('prompt') are not supported; send 'input' and 'instructions'"),
    "conversation": ((None,), "the Conversations API is not supported; chain responses with previous_response_id"),
    "truncation": ((None, "disabled"), "truncation 'auto' is not supported: a conversation that does not fit is an error"),
    "top_logprobs": ((None, 0), "top_logprobs is not supported on /v1/responses (use /v1/chat/completions)"),
    "max_tool_calls": ((None,), "max_tool_calls is not supported"),
    "context_management": ((None,), "context_management is not supported"),
}


def refuse_unsupported(req: ResponseRequest) -> None:
    extra = req.model_extra or {}
    for name, (neutral, why) in _UNSUPPORTED.items():
        if name in extra and extra[name] not in neutral:
            raise bad_request(why, param=name, code="unsupported_parameter")
    if req.text is not None and req.text.verbosity not in (None, "medium"):
        raise bad_request("text.verbosity is not supported", param="text.verbosity", code="unsupported_parameter")
    for i, tool in enumerate(req.tools or []):
        if tool.type != "function":
            raise bad_request(f"tools[{i}]: built-in tools of type '{tool.type}' are not supported; only 'function' "
                              "tools", param=f"tools[{i}].type", code="unsupported_parameter")
        if not tool.name:
            raise bad_request(f"tools[{i}]: a function tool needs a name", param=f"tools[{i}].name")
