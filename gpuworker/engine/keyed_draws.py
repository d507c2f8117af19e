"""Seeded draws that depend only on (seed, output token index).

A seeded request draws the uniforms of its output token i from a counter-based
stream keyed by (seed, i) (SplitMix64 over a counter), so token i is the same
whatever step, batch, number of speculated positions or attempt it falls in: a
job continued on another worker draws token N exactly as its first attempt would
have. Sampled jobs get a seed at admission, so this covers every sampled job.

The numbers are made on the host (a few integer operations each) and a step
uploads all rows' uniforms in one copy, instead of a torch.Generator per row.
"""
from __future__ import annotations

_MASK = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15


def _splitmix64(x: int) -> int:
    x = (x + _GOLDEN) & _MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK
    return x ^ (x >> 31)


class KeyedDraws:
    """The uniforms of one output token of a seeded request, in order (a rejected
    draw takes the next one)."""

    __slots__ = ("_state",)

    def __init__(self, seed: int, index: int):
        self._state = _splitmix64((int(seed) & _MASK) ^ _splitmix64(int(index)))

    def next_uniform(self) -> float:
        """In [0, 1), with 24 bits: exact in float32, never 1.0."""
        self._state = (self._state + _GOLDEN) & _MASK
        return (_splitmix64(self._state) >> 40) / 16777216.0
