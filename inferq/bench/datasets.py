"""Benchmark workloads: a list of prompts with the number of tokens to generate.

- ``random``: random token ids; input and output lengths uniform in
  ``[len * (1 - range_ratio), len * (1 + range_ratio)]`` (vLLM's random dataset).
- ``shared-prefix``: ``num_prefixes`` random prefixes of ``prefix_len`` tokens,
  each request one of them plus its own random suffix (exercises prefix caching).
- ``jsonl``: one JSON object per line with ``prompt`` (text) or
  ``prompt_token_ids``, and optionally ``max_tokens`` / ``output_len``.

Outputs are generated with ``ignore_eos`` so every request makes exactly its
requested number of tokens and runs are comparable.
"""
from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Union

# Stay clear of special tokens at the start of most vocabularies.
FIRST_ORDINARY_TOKEN = 1000


@dataclass
class BenchRequest:
    prompt: Union[str, list[int]]
    output_len: int
    prompt_len: Optional[int] = None  # known for token-id prompts


def _len_range(mean: int, ratio: float, name: str) -> tuple[int, int]:
    if mean < 1:
        raise ValueError(f"{name} must be at least 1, got {mean}")
    if not 0 <= ratio < 1:
        raise ValueError(f"range ratio must be in [0, 1), got {ratio}")
    return max(1, int(mean * (1 - ratio))), max(1, int(mean * (1 + ratio)))


def _tokens(rng: random.Random, n: int, vocab_size: int) -> list[int]:
    lo = min(FIRST_ORDINARY_TOKEN, vocab_size // 4)
    return [rng.randrange(lo, vocab_size) for _ in range(n)]


def random_dataset(n: int, input_len: int, output_len: int, range_ratio: float = 0.0,
                   vocab_size: int = 49152, seed: int = 0) -> list[BenchRequest]:
    if n < 1:
        raise ValueError("need at least one request")
    rng = random.Random(seed)
    in_lo, in_hi = _len_range(input_len, range_ratio, "input length")
    out_lo, out_hi = _len_range(output_len, range_ratio, "output length")
    reqs = []
    for _ in range(n):
        k = rng.randint(in_lo, in_hi)
        reqs.append(BenchRequest(_tokens(rng, k, vocab_size), rng.randint(out_lo, out_hi), k))
    return reqs


def shared_prefix_dataset(n: int, num_prefixes: int, prefix_len: int, suffix_len: int, output_len: int,
                          vocab_size: int = 49152, seed: int = 0) -> list[BenchRequest]:
    if n < 1 or num_prefixes < 1:
        raise ValueError("need at least one request and one prefix")
    if prefix_len < 1 or suffix_len < 1 or output_len < 1:
        raise ValueError("prefix, suffix and output lengths must be at least 1")
    rng = random.Random(seed)
    prefixes = [_tokens(rng, prefix_len, vocab_size) for _ in range(num_prefixes)]
    reqs = []
    for i in range(n):
        p = prefixes[i % num_prefixes] + _tokens(rng, suffix_len, vocab_size)
        reqs.append(BenchRequest(p, output_len, len(p)))
    rng.shuffle(reqs)
    return reqs


def jsonl_dataset(path: Union[str, Path], n: Optional[int] = None, default_output_len: int = 128) -> list[BenchRequest]:
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"dataset file {path} does not exist")
    reqs = []
    for lineno, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}:{lineno}: not JSON ({e.msg})") from None
        if not isinstance(row, dict):
            raise ValueError(f"{path}:{lineno}: each line must be a JSON object")
        out_len = row.get("max_tokens", row.get("output_len", default_output_len))
        if not isinstance(out_len, int) or out_len < 1:
            raise ValueError(f"{path}:{lineno}: max_tokens/output_len must be a positive integer")
        if isinstance(row.get("prompt_token_ids"), list) and row["prompt_token_ids"]:
            ids = row["prompt_token_ids"]
            if not all(isinstance(t, int) and t >= 0 for t in ids):
                raise ValueError(f"{path}:{lineno}: prompt_token_ids must be non-negative integers")
            reqs.append(BenchRequest(list(ids), out_len, len(ids)))
        elif isinstance(row.get("prompt"), str) and row["prompt"]:
            reqs.append(BenchRequest(row["prompt"], out_len))
        else:
            raise ValueError(f"{path}:{lineno}: needs a non-empty 'prompt' string or 'prompt_token_ids' list")
        if n is not None and len(reqs) >= n:
            break
    if not reqs:
        raise ValueError(f"{path} holds no requests")
    return reqs
