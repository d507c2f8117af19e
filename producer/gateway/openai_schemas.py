"""OpenAI request bodies the gateway accepts, and how they become a Job.

Unknown fields are ignored (OpenAI clients send extras such as `user`), but the
ones we do read are validated, and requests we cannot honour (batched prompts,
image parts, the generation-changing parameters listed in
openai_structured.UNSUPPORTED) are refused with a message that says so.
"""
from __future__ import annotations

from typing import Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from inferq.schemas import SamplingParams
from inferq.schemas.sampling import MAX_N
from inferq.producer.gateway.config import GatewaySettings
from inferq.producer.gateway.errors import bad_request
from inferq.producer.gateway.openai_structured import StructuredFields
from inferq.producer.gateway.openai_tools import ToolCallIn, ToolChoice, ToolDef


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore")
    include_usage: bool = False


class _Common(StructuredFields):
    # Unknown fields are kept (not read) so that build_sampling can refuse the
    # generation-changing ones we do not implement (openai_structured.UNSUPPORTED).
    model_config = ConfigDict(extra="allow")

    model: Optional[str] = Field(None, max_length=256)
    max_tokens: Optional[int] = Field(None, ge=1)
    temperature: Optional[float] = Field(None, ge=0.0, le=2.0)
    top_p: Optional[float] = Field(None, gt=0.0, le=1.0)
    seed: Optional[int] = Field(None, ge=0, lt=2**63)
    stop: Optional[Union[str, list[str]]] = None
    stream: bool = False
    stream_options: Optional[StreamOptions] = None
    n: int = Field(1, ge=1)
    # vLLM's extension: top-N logprobs of every prompt token (null for the first).
    prompt_logprobs: Optional[int] = Field(None, ge=0, le=20)
    presence_penalty: Optional[float] = Field(None, ge=-2.0, le=2.0)
    frequency_penalty: Optional[float] = Field(None, ge=-2.0, le=2.0)
    user: Optional[str] = None
    # vLLM-style extras, accepted through `extra_body` of the openai client.
    top_k: Optional[int] = Field(None, ge=-1)
    min_p: Optional[float] = Field(None, ge=0.0, le=1.0)
    repetition_penalty: Optional[float] = Field(None, gt=0.0, le=10.0)
    ignore_eos: Optional[bool] = None
    stop_token_ids: Optional[list[int]] = None
    priority: int = Field(0, ge=-1000, le=1000)
    # OpenAI's service tiers: "flex" (slower, cheaper) runs in the batch class,
    # behind every interactive job; the others are interactive.
    service_tier: Optional[Literal["auto", "default", "flex", "priority"]] = None
    # inferq extension: requests of one session prefer the worker that served it last.
    session_id: Optional[str] = Field(None, min_length=1, max_length=256)

    @property
    def priority_class(self) -> str:
        return "batch" if self.service_tier == "flex" else "interactive"

    @field_validator("n")
    @classmethod
    def _n_in_range(cls, v: int) -> int:
        if v > MAX_N:
            raise ValueError(f"n={v} exceeds the limit of {MAX_N} choices per request")
        return v

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    def sampling_fields(self) -> dict[str, Any]:
        fields = {
            "temperature": self.temperature, "top_p": self.top_p, "seed": self.seed,
            "presence_penalty": self.presence_penalty, "frequency_penalty": self.frequency_penalty,
            "top_k": self.top_k, "min_p": self.min_p, "repetition_penalty": self.repetition_penalty,
            "ignore_eos": self.ignore_eos, "stop_token_ids": self.stop_token_ids,
        }
        fields = {k: v for k, v in fields.items() if v is not None}
        if self.stop is not None:
            fields["stop"] = [self.stop] if isinstance(self.stop, str) else self.stop
        return fields


class CompletionRequest(_Common):
    prompt: Union[str, list[str], list[int], list[list[int]]]
    logprobs: Optional[int] = Field(None, ge=0, le=20)
    echo: bool = False
    suffix: Optional[str] = None
    # Generate this many sequences, return the n with the highest cumulative logprob.
    best_of: Optional[int] = Field(None, ge=1)

    @field_validator("best_of")
    @classmethod
    def _best_of_in_range(cls, v: Optional[int]) -> Optional[int]:
        if v is not None and v > MAX_N:
            raise ValueError(f"best_of={v} exceeds the limit of {MAX_N} sequences per request")
        return v

    def sampling_fields(self) -> dict[str, Any]:
        """best_of as OpenAI defines it: at least n, and not with stream when it is
        more than n (the best n are known only when every sequence has ended)."""
        fields = super().sampling_fields()
        if self.best_of is None:
            return fields
        if self.best_of < self.n:
            raise bad_request(f"best_of ({self.best_of}) must be at least n ({self.n})", param="best_of")
        if self.stream and self.best_of > self.n:
            raise bad_request("best_of cannot be used with stream (unless best_of equals n)", param="best_of")
        fields["best_of"] = self.best_of
        return fields

    def single_prompt(self) -> tuple[Optional[str], Optional[list[int]]]:
        """(text, token ids): exactly one is set."""
        p = self.prompt
        if isinstance(p, str):
            return p, None
        if not p:
            raise bad_request("prompt must not be empty", param="prompt")
        if all(isinstance(x, int) for x in p):
            return None, list(p)  # type: ignore[arg-type]
        if len(p) == 1:
            only = p[0]
            return (only, None) if isinstance(only, str) else (None, list(only))
        raise bad_request("batched prompts are not supported; send one request per prompt", param="prompt")


class ContentPart(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: str
    text: Optional[str] = None


class ChatMessageIn(BaseModel):
    model_config = ConfigDict(extra="ignore")
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Union[str, list[ContentPart], None] = None
    # Tool calling: an assistant turn's calls; a tool turn's answer to one of them.
    tool_calls: Optional[list[ToolCallIn]] = None
    tool_call_id: Optional[str] = Field(None, max_length=256)
    name: Optional[str] = Field(None, max_length=256)

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        texts = []
        for part in self.content:
            if part.type != "text":
                raise bad_request(f"message content of type '{part.type}' is not supported; only text", param="messages")
            texts.append(part.text or "")
        return "".join(texts)

    def job_message(self) -> dict:
        # "developer" is OpenAI's newer name for the system role.
        msg: dict = {"role": "system" if self.role == "developer" else self.role, "content": self.text()}
        if self.role == "tool":
            if not self.tool_call_id:
                raise bad_request("a message with role 'tool' needs the tool_call_id it answers", param="messages")
            msg["tool_call_id"] = self.tool_call_id
        if self.tool_calls and self.role == "assistant":
            msg["tool_calls"] = [c.job_dict() for c in self.tool_calls]
        if self.name is not None and self.role == "tool":
            msg["name"] = self.name
        return msg


class ChatCompletionRequest(_Common):
    messages: list[ChatMessageIn] = Field(min_length=1)
    logprobs: bool = False
    top_logprobs: Optional[int] = Field(None, ge=0, le=20)
    max_completion_tokens: Optional[int] = Field(None, ge=1)
    # Tool calling (producer/gateway/openai_tools.py).
    tools: Optional[list[ToolDef]] = None
    tool_choice: Optional[ToolChoice] = None
    parallel_tool_calls: bool = True
    # vLLM's: extra variables for the model's chat template, e.g. {"enable_thinking": false}.
    chat_template_kwargs: Optional[dict[str, Any]] = None

    def job_messages(self) -> list[dict]:
        return [m.job_message() for m in self.messages]


def build_sampling(req: _Common, settings: GatewaySettings, max_tokens: Optional[int],
                   logprobs: Optional[int], prompt_logprobs: Optional[int] = None) -> SamplingParams:
    if max_tokens is not None and max_tokens > settings.max_tokens_cap:
        raise bad_request(f"max_tokens={max_tokens} exceeds this gateway's cap of {settings.max_tokens_cap}",
                          param="max_tokens")
    fields = req.sampling_fields()
    fields["n"] = req.n
    fields.update(req.shaping_fields())  # constraint (compiled here: a 400 if it cannot be), logit_bias, min_tokens
    fields["max_tokens"] = max_tokens if max_tokens is not None else min(settings.default_max_tokens, settings.max_tokens_cap)
    if logprobs is not None:
        fields["logprobs"] = logprobs
    if prompt_logprobs is not None:
        fields["prompt_logprobs"] = prompt_logprobs
    try:
        return SamplingParams(**fields)
    except ValidationError as e:
        problems = "; ".join(f"{'.'.join(map(str, err['loc'])) or 'sampling'}: {err['msg']}" for err in e.errors())
        raise bad_request(problems) from None


def check_prompt_size(settings: GatewaySettings, text: Optional[str] = None,
                      token_ids: Optional[list[int]] = None, messages: Optional[list[dict]] = None) -> None:
    if token_ids is not None and len(token_ids) > settings.max_prompt_tokens:
        raise bad_request(f"prompt has {len(token_ids)} tokens; this gateway accepts at most {settings.max_prompt_tokens}",
                          param="prompt", code="prompt_too_long")
    chars = len(text or "") + sum(len(m["content"]) for m in (messages or []))
    if chars > settings.max_prompt_chars:
        raise bad_request(f"prompt has {chars} characters; this gateway accepts at most {settings.max_prompt_chars}",
                          param="messages" if messages else "prompt", code="prompt_too_long")
