"""Hypothesis strategies for the fuzz tests: valid jobs and request bodies,
mutated ones, arbitrary JSON and arbitrary bytes. Valid cases ask for 1-2
tokens so the worker's share of the work stays small."""
from __future__ import annotations

import json

from hypothesis import strategies as st

JOB_FIELDS = ["id", "model", "prompt", "messages", "prompt_token_ids", "sampling", "priority", "deadline",
              "tenant", "metadata", "created_at"]
SAMPLING_FIELDS = ["max_tokens", "temperature", "top_p", "top_k", "min_p", "presence_penalty", "frequency_penalty",
                   "repetition_penalty", "seed", "stop", "stop_token_ids", "ignore_eos", "logprobs", "n",
                   "skip_special_tokens"]

json_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=20),
)
json_values = st.recursive(json_scalars, lambda kids: st.one_of(
    st.lists(kids, max_size=4), st.dictionaries(st.text(max_size=8), kids, max_size=4)), max_leaves=12)

# Text as clients send it, including the awkward parts: lone surrogates, NUL,
# control characters, right-to-left marks, emoji.
texts = st.one_of(st.text(max_size=40), st.sampled_from(["", " ", "\x00", "\ud800", "a\udfffb", "\u202e", "🤖" * 5,
                                                         "<|im_start|>", "</s>", "\n" * 10]))


@st.composite
def sampling(draw) -> dict:
    s: dict = {"max_tokens": draw(st.integers(1, 2))}
    if draw(st.booleans()):
        s["temperature"] = draw(st.sampled_from([0.0, 0.5, 1.0]))
    if draw(st.booleans()):
        s["top_p"] = draw(st.floats(0.05, 1.0))
    if draw(st.booleans()):
        s["top_k"] = draw(st.integers(-1, 50))
    if draw(st.booleans()):
        s["seed"] = draw(st.integers(0, 2**32))
    if draw(st.booleans()):
        s["stop"] = draw(st.lists(st.text(min_size=1, max_size=4), max_size=2))
    if draw(st.booleans()):
        s["logprobs"] = draw(st.integers(0, 3))
    if draw(st.booleans()):
        s["repetition_penalty"] = draw(st.floats(0.5, 2.0))
    return s


@st.composite
def valid_job(draw, model: str) -> dict:
    job: dict = {"model": model, "sampling": draw(sampling())}
    kind = draw(st.sampled_from(["prompt", "messages", "prompt_token_ids"]))
    if kind == "prompt":
        job["prompt"] = draw(texts)
    elif kind == "messages":
        job["messages"] = draw(st.lists(st.fixed_dictionaries({
            "role": st.sampled_from(["system", "user", "assistant", "tool"]), "content": texts}), min_size=1, max_size=3))
    else:
        job["prompt_token_ids"] = draw(st.lists(st.integers(0, 60_000), min_size=1, max_size=8))
    if draw(st.booleans()):
        job["priority"] = draw(st.integers(-1000, 1000))
    if draw(st.booleans()):
        job["metadata"] = draw(st.dictionaries(st.text(max_size=5), json_scalars, max_size=3))
    return job


@st.composite
def mutated(draw, base: dict, fields: list[str], nested: str | None = None, nested_fields: list[str] = ()) -> dict:
    """``base`` with 1-3 of: a field set to any JSON value, a field removed, an unknown field added."""
    out = json.loads(json.dumps(base))
    for _ in range(draw(st.integers(1, 3))):
        op = draw(st.sampled_from(["set", "drop", "extra", "nested"] if nested else ["set", "drop", "extra"]))
        if op == "set":
            out[draw(st.sampled_from(fields))] = draw(json_values)
        elif op == "drop" and out:
            out.pop(draw(st.sampled_from(sorted(out))), None)
        elif op == "extra":
            out[draw(st.text(min_size=1, max_size=10))] = draw(json_values)
        elif op == "nested":
            inner = out.get(nested)
            if isinstance(inner, dict):
                inner[draw(st.sampled_from(list(nested_fields)))] = draw(json_values)
    return out


@st.composite
def stream_entry(draw, model: str) -> tuple[str, dict]:
    """(kind, fields) for one XADD on the job stream."""
    kind = draw(st.sampled_from(["valid", "valid", "mutated", "mutated", "mutated", "json", "bytes", "fields"]))
    if kind == "valid":
        return kind, {"job": json.dumps(draw(valid_job(model)))}
    if kind == "mutated":
        return kind, {"job": json.dumps(draw(mutated(draw(valid_job(model)), JOB_FIELDS, "sampling", SAMPLING_FIELDS)))}
    if kind == "json":
        return kind, {"job": json.dumps(draw(json_values))}
    if kind == "bytes":  # invalid UTF-8 included
        return kind, {"job": draw(st.binary(max_size=60))}
    return kind, draw(st.dictionaries(st.binary(min_size=1, max_size=6), st.binary(max_size=30), min_size=1, max_size=3))
