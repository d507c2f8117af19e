"""Sampling parameters: the knobs of one generation, validated at the edge."""
from __future__ import annotations

from typing import Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from inferq.schemas.structured import StructuredOutputs

def require_utf8(text: str, what: str) -> None:
    """Everything travels as UTF-8 (Redis, JSON): a lone surrogate such as
    "\\ud800" is valid JSON but not encodable, so it is refused at the edge."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(f"{what} must be valid Unicode text (a lone surrogate cannot be encoded as UTF-8)") from None


# Upper bound on top-N logprobs per token (vLLM's default max_logprobs is 20).
MAX_LOGPROBS = 20
MAX_N = 16
# OpenAI caps logit_bias at 300 tokens, each bias in [-100, 100].
MAX_LOGIT_BIAS = 300
# What ``logprobs`` report (vLLM V1's logprobs modes): the model's own distribution
# (raw, the default) or the one the token was drawn from (processed: after
# penalties, temperature, min-p, top-k, top-p), as logprobs or as logits.
LOGPROBS_MODES = ("raw_logprobs", "raw_logits", "processed_logprobs", "processed_logits")
LogprobsMode = Literal["raw_logprobs", "raw_logits", "processed_logprobs", "processed_logits"]


class SamplingParams(BaseModel):
    """How to pick tokens and when to stop.

    Defaults follow vLLM: temperature 1.0, top_p 1.0, top_k disabled (-1 or 0),
    penalties neutral. ``temperature == 0`` means greedy.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_tokens: int = Field(16, ge=1, description="Most tokens to generate.")
    temperature: float = Field(1.0, ge=0.0, le=100.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int = Field(-1, ge=-1, description="-1 or 0 disables top-k.")
    min_p: float = Field(0.0, ge=0.0, le=1.0)
    presence_penalty: float = Field(0.0, ge=-2.0, le=2.0)
    frequency_penalty: float = Field(0.0, ge=-2.0, le=2.0)
    repetition_penalty: float = Field(1.0, gt=0.0, le=10.0)
    seed: Optional[int] = Field(None, ge=0, lt=2**63)
    stop: list[str] = Field(default_factory=list, max_length=16)
    stop_token_ids: list[int] = Field(default_factory=list, max_length=64)
    ignore_eos: bool = False
    logprobs: Optional[int] = Field(None, ge=0, le=MAX_LOGPROBS, description="Top-N logprobs per token.")
    logprobs_mode: LogprobsMode = Field("raw_logprobs", description="What logprobs report; see LOGPROBS_MODES.")
    prompt_logprobs: Optional[int] = Field(
        None, ge=0, le=MAX_LOGPROBS, description="Top-N logprobs per prompt token (the first has none)."
    )
    n: int = Field(1, ge=1, le=MAX_N, description="Choices per prompt: sibling sequences sharing the prompt's KV.")
    # OpenAI's completions best_of: this many sibling sequences are generated and the n
    # with the highest cumulative logprob of their sampled tokens are returned (None: n).
    best_of: Optional[int] = Field(None, ge=1, description="Sequences generated per prompt, of which the best n return.")
    skip_special_tokens: bool = True
    # Added to the logits of these token ids before sampling (OpenAI's logit_bias).
    logit_bias: Optional[dict[int, float]] = Field(None, max_length=MAX_LOGIT_BIAS)
    # EOS and stop token ids are masked until this many tokens are out (vLLM's min_tokens).
    min_tokens: int = Field(0, ge=0)
    # The text must match this constraint (JSON Schema, regex, choice, grammar).
    structured_outputs: Optional[StructuredOutputs] = None

    @field_validator("stop", mode="before")
    @classmethod
    def _stop_as_list(cls, v: Union[None, str, list[str]]):
        if v is None:
            return []
        if isinstance(v, str):
            return [v]
        return v

    @field_validator("stop")
    @classmethod
    def _stop_not_empty(cls, v: list[str]) -> list[str]:
        for s in v:
            if not s:
                raise ValueError("stop strings must be non-empty")
            if len(s) > 256:
                raise ValueError("stop strings must be at most 256 characters")
            require_utf8(s, "stop strings")
        return v

    @field_validator("stop_token_ids")
    @classmethod
    def _ids_non_negative(cls, v: list[int]) -> list[int]:
        if any(t < 0 for t in v):
            raise ValueError("stop_token_ids must be non-negative token ids")
        return v

    @field_validator("logit_bias")
    @classmethod
    def _bias_range(cls, v: Optional[dict[int, float]]):
        if v is None:
            return v
        for tok, bias in v.items():
            if tok < 0:
                raise ValueError("logit_bias keys must be non-negative token ids")
            if not -100.0 <= bias <= 100.0:
                raise ValueError(f"logit_bias values must be in [-100, 100]; got {bias} for token {tok}")
        return v or None

    @field_validator("best_of")
    @classmethod
    def _best_of_capped(cls, v: Optional[int]) -> Optional[int]:
        if v is not None and v > MAX_N:
            raise ValueError(f"best_of={v} exceeds the limit of {MAX_N} sequences per request")
        return v

    @model_validator(mode="after")
    def _consistent(self):
        if self.min_tokens > self.max_tokens:
            raise ValueError(f"min_tokens ({self.min_tokens}) must not exceed max_tokens ({self.max_tokens})")
        if self.best_of is not None and self.best_of < self.n:
            raise ValueError(f"best_of ({self.best_of}) must be at least n ({self.n}): "
                             "best_of sequences are generated and the best n returned")
        if self.ranks_choices and self.logprobs is not None and self.logprobs_mode.endswith("logits"):
            raise ValueError(f"best_of > n ranks sequences by logprobs; logprobs_mode {self.logprobs_mode!r} "
                             "reports logits: use raw_logprobs or processed_logprobs")
        return self

    @property
    def num_sequences(self) -> int:
        """Sibling sequences to generate: best_of, else n."""
        return self.best_of if self.best_of is not None else self.n

    @property
    def ranks_choices(self) -> bool:
        """More sequences than choices: only the best n are returned."""
        return self.num_sequences > self.n

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def shapes_logits(self) -> bool:
        """Changes the logits before sampling: logit bias, min_tokens or a constraint."""
        return self.logit_bias is not None or self.min_tokens > 0 or self.structured_outputs is not None

    @property
    def uses_penalties(self) -> bool:
        return (
            self.presence_penalty != 0.0
            or self.frequency_penalty != 0.0
            or self.repetition_penalty != 1.0
        )
