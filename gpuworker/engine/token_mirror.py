"""A Python token list mirrored in a numpy array that grows in place: each call
copies only the tokens appended since the last one (a request's list grows by a
token or a few a step), so per-step readers (penalties, n-gram lookup) never
convert a whole history again."""
from __future__ import annotations

import numpy as np


class TokenMirror:
    __slots__ = ("_buf", "_n")

    def __init__(self, capacity: int = 64):
        self._buf = np.empty(max(64, capacity), dtype=np.int64)
        self._n = 0

    def sync(self, tokens: list[int]) -> np.ndarray:
        """``tokens`` as an int64 array (a view: valid until the next call)."""
        n = len(tokens)
        if n < self._n:  # never expected (histories only grow); start over rather than lie
            self._n = 0
        if n > len(self._buf):
            grown = np.empty(max(n, 2 * len(self._buf)), dtype=np.int64)
            grown[: self._n] = self._buf[: self._n]
            self._buf = grown
        if n > self._n:
            self._buf[self._n : n] = tokens[self._n : n]
            self._n = n
        return self._buf[:n]
