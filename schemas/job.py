"""A generation job as it travels on the job stream."""
from __future__ import annotations

import json
import time
import uuid
from typing import Any, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, model_validator

from inferq.schemas.sampling import SamplingParams, require_utf8

MAX_PROMPT_CHARS = 1_000_000
MAX_METADATA_BYTES = 16_384


def new_job_id() -> str:
    return uuid.uuid4().hex


MAX_TOOLS = 128
MAX_TOOLS_BYTES = 262_144


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="forbid")

    role: Literal["system", "user", "assistant", "tool"]
    content: str = Field("", max_length=MAX_PROMPT_CHARS)
    # An assistant turn that called tools: OpenAI's [{id, type: "function", function: {name, arguments}}].
    tool_calls: Optional[list[dict[str, Any]]] = Field(None, max_length=MAX_TOOLS)
    # A tool's answer: the call it answers (and the function's name, for templates that want it).
    tool_call_id: Optional[str] = Field(None, max_length=256)
    name: Optional[str] = Field(None, max_length=256)


Task = Literal["generate", "embed", "tokenize", "detokenize"]


class EmbedOptions(BaseModel):
    """Task ``embed``: how the prompt's final hidden states become one vector."""

    model_config = ConfigDict(extra="forbid")

    # None: the worker's default (INFERQ_POOLING); "mean" over the prompt, or its "last" token.
    pooling: Optional[Literal["mean", "last"]] = None
    normalize: bool = True  # L2-normalise the pooled vector


class TokenizeOptions(BaseModel):
    """Task ``tokenize`` (vLLM's /tokenize fields)."""

    model_config = ConfigDict(extra="forbid")

    # None: True for ``prompt``, False for ``messages`` (the template writes the special tokens).
    add_special_tokens: Optional[bool] = None
    add_generation_prompt: bool = True  # with ``messages``


class Job(BaseModel):
    """Exactly one of ``prompt``, ``messages`` or ``prompt_token_ids`` is set.

    ``task`` says what the worker does with it: ``generate`` (sampling), ``embed`` (the
    pooled final hidden states of the prompt, no sampling), ``tokenize`` (``prompt`` or
    ``messages`` to token ids) or ``detokenize`` (``prompt_token_ids`` to text); the
    last two are answered without an engine step."""

    model_config = ConfigDict(extra="forbid")

    id: str = Field(default_factory=new_job_id, min_length=1, max_length=128, pattern=r"^[A-Za-z0-9_.:-]+$")
    model: str = Field(min_length=1, max_length=256)
    prompt: Optional[str] = Field(None, max_length=MAX_PROMPT_CHARS)
    messages: Optional[list[ChatMessage]] = Field(None, min_length=1, max_length=1024)
    prompt_token_ids: Optional[list[int]] = Field(None, min_length=1, max_length=1_000_000)
    sampling: SamplingParams = Field(default_factory=SamplingParams)
    priority: int = Field(0, ge=-1000, le=1000, description="Lower value is served first (vLLM's convention), within its class.")
    priority_class: Literal["interactive", "batch"] = Field(
        "interactive", description="A worker takes every waiting interactive job before any batch job, and may "
                                   "preempt a running batch job for an interactive one.")
    deadline: Optional[float] = Field(None, description="Unix time after which the job is finished with reason 'deadline'.")
    tenant: Optional[str] = Field(None, max_length=128)
    session_id: Optional[str] = Field(None, min_length=1, max_length=256,
                                      description="Jobs of one session prefer the worker that served it last "
                                                  "(its prefix cache).")
    # OpenAI-style tool definitions ([{type: "function", function: {name, description, parameters}}]),
    # rendered into the prompt by the model's chat template (only with ``messages``).
    tools: Optional[list[dict[str, Any]]] = Field(None, min_length=1, max_length=MAX_TOOLS)
    # Extra variables for the chat template (vLLM's chat_template_kwargs), e.g. Qwen3's
    # {"enable_thinking": false}; only with ``messages``.
    chat_template_kwargs: Optional[dict[str, Any]] = None
    metadata: dict[str, Any] = Field(default_factory=dict)
    created_at: float = Field(default_factory=time.time)
    task: Task = "generate"
    embed: Optional[EmbedOptions] = None
    tokenize: Optional[TokenizeOptions] = None

    @model_validator(mode="after")
    def _one_prompt(self):
        given = [x is not None for x in (self.prompt, self.messages, self.prompt_token_ids)]
        if sum(given) != 1:
            raise ValueError("exactly one of 'prompt', 'messages' or 'prompt_token_ids' must be given")
        if self.prompt_token_ids is not None and any(t < 0 for t in self.prompt_token_ids):
            raise ValueError("prompt_token_ids must be non-negative")
        if self.tools is not None:
            if self.messages is None:
                raise ValueError("'tools' need 'messages' (they are rendered by the chat template)")
            if len(json.dumps(self.tools)) > MAX_TOOLS_BYTES:
                raise ValueError(f"tools must serialise to at most {MAX_TOOLS_BYTES} bytes")
        if self.chat_template_kwargs is not None:
            check_template_kwargs(self.chat_template_kwargs, self.messages is not None)
        self._check_task()
        if len(json.dumps(self.metadata)) > MAX_METADATA_BYTES:
            raise ValueError(f"metadata must serialise to at most {MAX_METADATA_BYTES} bytes")
        # pydantic refuses lone surrogates in str fields, not inside free-form metadata.
        require_utf8(json.dumps(self.metadata, ensure_ascii=False), "metadata")
        return self

    def _check_task(self) -> None:
        task = self.task
        if self.embed is not None and task != "embed":
            raise ValueError("'embed' options need task 'embed'")
        if self.tokenize is not None and task != "tokenize":
            raise ValueError("'tokenize' options need task 'tokenize'")
        if task == "generate":
            return
        # Nothing is sampled: sampling fields would be silently ignored, so they are refused.
        if self.sampling != SamplingParams():
            raise ValueError(f"'sampling' applies to task 'generate' only, not {task!r}")
        if self.tools is not None:
            raise ValueError(f"'tools' apply to task 'generate' only, not {task!r}")
        if task == "tokenize" and self.prompt_token_ids is not None:
            raise ValueError("task 'tokenize' takes 'prompt' or 'messages'")
        if task == "detokenize" and self.prompt_token_ids is None:
            raise ValueError("task 'detokenize' takes 'prompt_token_ids'")

    # Redis stream entries are flat string maps: the job travels as one JSON field.
    def to_fields(self) -> dict[str, str]:
        # The default task is left out: a worker that predates tasks still reads the job.
        exclude = {"task"} if self.task == "generate" else None
        return {JOB_FIELD: self.model_dump_json(exclude_none=True, exclude=exclude)}

    @classmethod
    def from_fields(cls, fields: dict) -> "Job":
        raw = job_payload(fields)
        if raw is None:
            raise ValueError(f"stream entry has no '{JOB_FIELD}' field")
        if isinstance(raw, bytes):
            raw = raw.decode("utf-8")  # strict: invalid UTF-8 is the client's error
        return cls.model_validate_json(raw)


MAX_TEMPLATE_KWARGS_BYTES = 16_384
# Names apply_chat_template takes itself: as template variables they would change how
# the prompt is built (or which template builds it), not what the template says.
RESERVED_TEMPLATE_KWARGS = frozenset({
    "conversation", "messages", "tools", "documents", "chat_template", "add_generation_prompt",
    "continue_final_message", "tokenize", "padding", "truncation", "max_length", "return_tensors",
    "return_dict", "return_assistant_tokens_mask", "tokenizer_kwargs"})


def check_template_kwargs(kwargs: dict[str, Any], has_messages: bool) -> None:
    if not has_messages:
        raise ValueError("'chat_template_kwargs' need 'messages' (they go to the chat template)")
    reserved = sorted(RESERVED_TEMPLATE_KWARGS.intersection(kwargs))
    if reserved:
        raise ValueError(f"chat_template_kwargs may not set {', '.join(reserved)}")
    if len(json.dumps(kwargs)) > MAX_TEMPLATE_KWARGS_BYTES:
        raise ValueError(f"chat_template_kwargs must serialise to at most {MAX_TEMPLATE_KWARGS_BYTES} bytes")
    require_utf8(json.dumps(kwargs, ensure_ascii=False), "chat_template_kwargs")


JOB_FIELD = "job"


def job_payload(fields: dict):
    """The job's raw payload (bytes or str, exactly as stored) or None."""
    return fields.get(JOB_FIELD) if JOB_FIELD in fields else fields.get(JOB_FIELD.encode())
