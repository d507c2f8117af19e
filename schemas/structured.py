"""Structured outputs: the constraint a job's text must satisfy, as it travels on the wire.

One model, ``StructuredOutputs`` (vLLM's name and fields), with exactly one of:
a JSON Schema, any JSON object, a regular expression, a list of choices, or a
Lark grammar. It is checked wherever a job is built (gateway, SDK, Celery, Batch
API lines, and again by the worker) with the same library the worker decodes
with, llguidance: a schema it cannot compile, or a keyword it does not implement,
is refused before the job reaches Redis. llguidance has no dependencies (no
torch), so the light producer side can afford it.
"""
from __future__ import annotations

import hashlib
import json
from typing import Any, Optional, Union

import llguidance
from pydantic import BaseModel, ConfigDict, Field, model_validator

# Caps: a constraint rides in every copy of the job (stream entry, DLQ, batch lines).
MAX_CONSTRAINT_BYTES = 65_536
MAX_CHOICES = 256
MAX_CHOICE_CHARS = 1_024

KINDS = ("json", "json_object", "regex", "choice", "grammar")
# JSON is generated on one line with OpenAI's separators ({"a": 1, "b": [2, 3]}):
# llguidance's default admits any whitespace between tokens, and small models
# sampled at high temperature can then spend their whole budget on newlines.
# A schema's own "x-guidance" options override this.
JSON_STYLE = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


class StructuredOutputs(BaseModel):
    """Exactly one constraint. ``json`` is a JSON Schema (object or its JSON text);
    ``grammar`` is Lark syntax as llguidance reads it (``start`` is the root rule)."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    json_schema: Optional[Union[dict[str, Any], bool]] = Field(None, alias="json")
    json_object: bool = False
    regex: Optional[str] = Field(None, min_length=1, max_length=MAX_CONSTRAINT_BYTES)
    choice: Optional[list[str]] = Field(None, min_length=1, max_length=MAX_CHOICES)
    grammar: Optional[str] = Field(None, min_length=1, max_length=MAX_CONSTRAINT_BYTES)

    @model_validator(mode="before")
    @classmethod
    def _schema_text(cls, data):
        # OpenAI clients and vLLM's guided_json accept the schema as a JSON string too.
        if isinstance(data, dict):
            for key in ("json", "json_schema"):
                if isinstance(data.get(key), str):
                    try:
                        data = {**data, key: json.loads(data[key])}
                    except json.JSONDecodeError as e:
                        raise ValueError(f"the JSON schema is not valid JSON: {e}") from None
        return data

    @model_validator(mode="after")
    def _one_and_compilable(self):
        given = [k for k in KINDS if self._value(k) not in (None, False)]
        if len(given) != 1:
            raise ValueError("structured outputs take exactly one of json, json_object, regex, choice or grammar"
                             + (f"; got {', '.join(given)}" if given else ""))
        if self.choice is not None and any(not c or len(c) > MAX_CHOICE_CHARS for c in self.choice):
            raise ValueError(f"every choice must be a non-empty string of at most {MAX_CHOICE_CHARS} characters")
        spec = self.grammar_spec()
        if len(spec) > 4 * MAX_CONSTRAINT_BYTES:
            raise ValueError(f"the constraint is too large (more than {MAX_CONSTRAINT_BYTES} bytes)")
        if self.json_schema is not None and len(json.dumps(self.json_schema)) > MAX_CONSTRAINT_BYTES:
            raise ValueError(f"the JSON schema is too large (more than {MAX_CONSTRAINT_BYTES} bytes)")
        problem = llguidance.LLMatcher.validate_grammar(spec)
        if problem:
            raise ValueError(f"the {given[0]} constraint cannot be compiled: {problem.strip()}")
        return self

    def _value(self, kind: str):
        return self.json_schema if kind == "json" else getattr(self, kind)

    @property
    def kind(self) -> str:
        return next(k for k in KINDS if self._value(k) not in (None, False))

    def grammar_spec(self) -> str:
        """The llguidance grammar (its JSON form) that both validation and the worker's matcher use."""
        M = llguidance.LLMatcher
        if self.json_schema is not None:
            return M.grammar_from_json_schema(self.json_schema, defaults=JSON_STYLE)
        if self.json_object:
            return M.grammar_from_json_schema({"type": "object"}, defaults=JSON_STYLE)
        if self.regex is not None:
            return M.grammar_from_regex(self.regex)
        if self.choice is not None:
            # JSON string literals are valid Lark string literals (same escapes).
            return M.grammar_from_lark("start: " + " | ".join(json.dumps(c, ensure_ascii=False) for c in self.choice))
        return M.grammar_from_lark(self.grammar)

    def cache_key(self) -> str:
        """Equal constraints share one compiled grammar in the worker."""
        return hashlib.sha256(self.grammar_spec().encode()).hexdigest()
