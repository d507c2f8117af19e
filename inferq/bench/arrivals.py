"""Request arrival times, as `vllm bench serve` draws them.

Gaps between requests are gamma-distributed with shape ``burstiness`` and mean
``1 / rate``: burstiness 1 is a Poisson process (exponential gaps), below 1 is
burstier, above 1 more regular. An infinite rate sends everything at once.
"""
from __future__ import annotations

import math
import random
from typing import Optional


def arrival_offsets(n: int, rate: float, burstiness: float = 1.0, seed: Optional[int] = 0) -> list[float]:
    """Seconds from the start at which each of ``n`` requests is sent (first at 0)."""
    if n < 0:
        raise ValueError("the number of requests cannot be negative")
    if not rate > 0:
        raise ValueError(f"request rate must be positive (or inf), got {rate}")
    if not burstiness > 0:
        raise ValueError(f"burstiness must be positive, got {burstiness}")
    if math.isinf(rate):
        return [0.0] * n
    rng = random.Random(seed)
    theta = 1.0 / (rate * burstiness)  # gamma scale: mean gap = shape * scale = 1 / rate
    t, out = 0.0, []
    for i in range(n):
        if i:
            t += rng.gammavariate(burstiness, theta)
        out.append(t)
    return out
