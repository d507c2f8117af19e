"""The mixed workload of `bench modes`: mostly short prompts with some long
ones, varied output lengths, Poisson arrivals (exponential gaps at a rate)."""
from __future__ import annotations

import math
import random
from dataclasses import dataclass


@dataclass
class TimedRequest:
    request_id: str
    prompt_token_ids: list[int]
    output_len: int
    arrival_s: float  # seconds after the start of the run

    @property
    def final_len(self) -> int:
        return len(self.prompt_token_ids) + self.output_len


def _uniform(rng: random.Random, lo: int, hi: int, name: str) -> int:
    if lo < 1 or hi < lo:
        raise ValueError(f"{name}: need 1 <= min <= max, got [{lo}, {hi}]")
    return rng.randint(lo, hi)


def mixed_workload(n: int, *, short_input: tuple[int, int], long_input: tuple[int, int], long_fraction: float,
                   output: tuple[int, int], request_rate: float, vocab_size: int, seed: int = 0) -> list[TimedRequest]:
    if n < 1:
        raise ValueError("need at least one request")
    if not 0 <= long_fraction <= 1:
        raise ValueError("long fraction must be in [0, 1]")
    if not request_rate > 0:
        raise ValueError("request rate must be positive (inf: all at once)")
    rng = random.Random(seed)
    lo_tok = min(1000, vocab_size // 4)  # clear of special tokens
    n_long = round(n * long_fraction)
    kinds = [True] * n_long + [False] * (n - n_long)
    rng.shuffle(kinds)
    t, out = 0.0, []
    for i, is_long in enumerate(kinds):
        if i and not math.isinf(request_rate):
            t += rng.expovariate(request_rate)
        k = _uniform(rng, *(long_input if is_long else short_input), "long input" if is_long else "short input")
        prompt = [rng.randrange(lo_tok, vocab_size) for _ in range(k)]
        out.append(TimedRequest(f"req-{i}", prompt, _uniform(rng, *output, "output"), t))
    return out
