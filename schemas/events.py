"""Events on a job's reply stream.

Each entry carries ``type``, ``attempt`` (delivery attempt that produced it) and
``seq`` (position within that attempt). A client that sees ``restarted`` drops
what it collected for earlier attempts, except what its ``resume`` points keep: a
continued attempt carries on from the tokens already published (request migration).
"""
from __future__ import annotations

import array
import base64
import json
import sys

from typing import Annotated, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

from inferq.schemas.text import as_str


class _Event(BaseModel):
    model_config = ConfigDict(extra="forbid")

    attempt: int = 0
    seq: int = 0


class QueuedEvent(_Event):
    type: Literal["queued"] = "queued"
    model: str = ""


class StartedEvent(_Event):
    type: Literal["started"] = "started"
    worker: str = ""


class DeltaEvent(_Event):
    type: Literal["delta"] = "delta"
    # Which choice (sampling.n > 1) this text belongs to; 0 for single-choice jobs.
    index: int = Field(0, ge=0)
    text: str = ""
    token_ids: list[int] = Field(default_factory=list)
    # One entry per token: {"token_id": lp, ...} top-N plus the chosen token.
    logprobs: Optional[list[dict[int, float]]] = None
    # Only on an attempt's first delta, when the job asked for prompt_logprobs: the
    # prompt's token ids and one entry per prompt token (None for the first).
    prompt_token_ids: Optional[list[int]] = None
    prompt_logprobs: Optional[list[Optional[dict[int, float]]]] = None
    # Set on a choice's last delta when the job has several choices (n > 1): that
    # choice is over, the others may go on; ``done`` still ends the job.
    finish_reason: Optional[str] = None


class ResumePoint(BaseModel):
    """How much of one choice a continued attempt keeps from the attempt before it:
    its first ``tokens`` token ids and ``chars`` characters of text. A choice that
    had already ended keeps its ``finish_reason``."""

    model_config = ConfigDict(extra="forbid")

    index: int = Field(0, ge=0)
    tokens: int = Field(ge=0)
    chars: int = Field(ge=0)
    finish_reason: Optional[str] = None


class RestartedEvent(_Event):
    type: Literal["restarted"] = "restarted"
    reason: str = ""
    # None: the attempt starts over. A list: it continues each listed choice from its
    # point (choices not listed start empty); its deltas extend that text.
    resume: Optional[list[ResumePoint]] = None


class Usage(BaseModel):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


class Timings(BaseModel):
    """Seconds."""

    queue: float = 0.0
    ttft: Optional[float] = None
    total: float = 0.0


FinishReason = Literal["stop", "length", "abort", "deadline"]

MAX_EMBEDDING_DIMS = 65_536
MAX_EMBEDDING_B64 = 4 * (4 * MAX_EMBEDDING_DIMS // 3 + 1)


def embedding_floats(b64: str) -> list[float]:
    """A ``done`` event's ``embedding`` (base64 of little-endian float32) as floats."""
    floats = array.array("f")
    floats.frombytes(base64.b64decode(b64))
    if sys.byteorder == "big":
        floats.byteswap()
    return floats.tolist()


class ChoiceEnd(BaseModel):
    """How one choice of a several-choice job (n > 1) ended."""

    index: int = Field(ge=0)
    finish_reason: FinishReason
    completion_tokens: int = 0
    stop_reason: Optional[Union[str, int]] = None


class DoneEvent(_Event):
    type: Literal["done"] = "done"
    finish_reason: FinishReason  # of choice 0
    usage: Usage = Field(default_factory=Usage)  # completion_tokens summed over every choice
    timings: Timings = Field(default_factory=Timings)
    # With n > 1: one entry per choice, by index (None for single-choice jobs).
    choices: Optional[list[ChoiceEnd]] = None
    # Task "embed": the vector, base64 of its little-endian float32 bytes (OpenAI's
    # encoding_format "base64"); bounded by the largest hidden size we expect.
    embedding: Optional[str] = Field(None, max_length=MAX_EMBEDDING_B64)
    # Task "tokenize": the serving model's context length (vLLM's max_model_len).
    max_model_len: Optional[int] = None


class ErrorEvent(_Event):
    type: Literal["error"] = "error"
    code: str
    message: str


ReplyEvent = Annotated[
    Union[QueuedEvent, StartedEvent, DeltaEvent, RestartedEvent, DoneEvent, ErrorEvent],
    Field(discriminator="type"),
]
_adapter: TypeAdapter = TypeAdapter(ReplyEvent)

TERMINAL_TYPES = frozenset({"done", "error"})


def encode_event(event: BaseModel) -> dict[str, str]:
    """Flat field map for XADD: the type stays readable, the body is JSON."""
    return {"type": event.type, "data": event.model_dump_json(exclude={"type"})}


def decode_event(fields: dict) -> ReplyEvent:
    f = {as_str(k): as_str(v) for k, v in fields.items()}
    body = json.loads(f.get("data", "{}"))
    body["type"] = f["type"]
    return _adapter.validate_python(body)
