"""What a worker or ``LLM(speculative=...)`` asks of speculative decoding."""
from __future__ import annotations

from typing import Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, model_validator


class SpeculativeConfig(BaseModel):
    """``{"method": "ngram", "k": 4}`` or ``{"method": "draft_model", "model": "/models/small", "k": 4}``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    method: Literal["ngram", "draft_model"] = "ngram"
    # Tokens proposed per request per step (vLLM: num_speculative_tokens).
    k: int = Field(4, ge=1, le=16)
    # Prompt lookup: the longest suffix of n tokens (max_n down to min_n) seen before
    # in the request's own tokens proposes the k tokens that followed it there.
    min_n: int = Field(2, ge=1, le=16)
    max_n: int = Field(4, ge=1, le=16)
    # draft_model: a folder or .gguf of a smaller model with the same tokenizer.
    model: Optional[str] = None
    # Adaptive (gpuworker/engine/speculative/controller.py): a request whose recent
    # acceptance (accepted / proposed) falls below min_acceptance stops proposing for
    # cooldown_tokens of output, then tries again; no request proposes while more than
    # max_batch requests decode (decode is then compute-bound and verifying k extra
    # rows per request costs about k times a token).
    min_acceptance: float = Field(0.2, ge=0.0, le=1.0)
    cooldown_tokens: int = Field(32, ge=0)
    max_batch: int = Field(16, ge=1)

    @model_validator(mode="after")
    def _check(self) -> "SpeculativeConfig":
        if self.min_n > self.max_n:
            raise ValueError(f"min_n ({self.min_n}) must not exceed max_n ({self.max_n})")
        if self.method == "draft_model" and not self.model:
            raise ValueError("method 'draft_model' needs model: a folder or .gguf of the draft model")
        if self.method == "ngram" and self.model:
            raise ValueError("model is only for method 'draft_model'")
        return self

    def describe(self) -> str:
        """One short line for logs, the config metric and `inferq doctor`."""
        what = f"n={self.min_n}..{self.max_n}" if self.method == "ngram" else f"model={self.model}"
        return f"{self.method} k={self.k} {what} max_batch={self.max_batch}"

    @classmethod
    def parse(cls, value) -> Optional["SpeculativeConfig"]:
        """None, a SpeculativeConfig, a dict, or a JSON string (the worker's flag)."""
        if value is None or value == "" or isinstance(value, cls):
            return value or None
        if isinstance(value, str):
            return cls.model_validate_json(value)
        return cls.model_validate(value)
