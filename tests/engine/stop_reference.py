"""Reference stop-string behaviour, by brute force, for the detokenizer tests."""
from __future__ import annotations


def first_stop(text: str, stops: list[str]):
    """The stop completed first reading left to right (ties: earliest start):
    (text before it, the stop) or (text, None)."""
    best = None
    for s in stops:
        i = text.find(s)
        if i >= 0 and (best is None or (i + len(s), i) < best[:2]):
            best = (i + len(s), i, s)
    return (text, None) if best is None else (text[: best[1]], best[2])


def longest_stop_prefix_tail(text: str, stops: list[str]) -> int:
    """How many trailing characters could still grow into a stop string."""
    best = 0
    for s in stops:
        for h in range(1, min(len(s) - 1, len(text)) + 1):
            if s.startswith(text[-h:]):
                best = max(best, h)
    return best
