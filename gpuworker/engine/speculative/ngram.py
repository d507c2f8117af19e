"""Prompt lookup (n-gram) proposals: no second model.

If the last n tokens of a request (n from ``max_n`` down to ``min_n``) occurred
earlier in its prompt or output, the k tokens that followed the latest earlier
occurrence are the proposal. It pays off where output copies input: extraction,
rewriting, summaries quoting the text, structured outputs echoing fields, code
edits. Nothing matches on text that copies nothing, so nothing is verified
there and speculation costs only this lookup.

Each request's tokens are mirrored in a numpy array grown in place
(gpuworker/engine/token_mirror.py: only the new tokens are copied each step), so a lookup is a few vectorised compares over
the request's history (~10 us at 1,500 tokens), not a Python scan.
"""
from __future__ import annotations

import numpy as np

from inferq.gpuworker.engine.request import Request
from inferq.gpuworker.engine.token_mirror import TokenMirror
from inferq.gpuworker.engine.speculative.proposer import Proposer


def lookup(tokens: np.ndarray, min_n: int, max_n: int, k: int) -> list[int]:
    """The k tokens after the latest earlier occurrence of the longest matching
    suffix (max_n down to min_n tokens); [] when none matches."""
    length = tokens.shape[0]
    if length < min_n + 1 or k < 1:
        return []
    # Candidate ends: earlier positions holding the last token (the suffix's end).
    ends = np.flatnonzero(tokens[: length - 1] == tokens[length - 1])
    if ends.size == 0:
        return []
    best_end, best_n = -1, 0
    for n in range(min(max_n, length - 1), min_n - 1, -1):
        cand = ends[ends >= n - 1]
        if cand.size == 0:
            continue
        ok = np.ones(cand.size, dtype=bool)
        for back in range(1, n):
            ok &= tokens[cand - back] == tokens[length - 1 - back]
        hits = cand[ok]
        if hits.size:
            best_end, best_n = int(hits[-1]), n
            break
    if best_n == 0:
        return []
    return tokens[best_end + 1 : best_end + 1 + k].tolist()


class NgramProposer(Proposer):
    def __init__(self, k: int, min_n: int, max_n: int):
        self.k, self.min_n, self.max_n = k, min_n, max_n
        self._history: dict[str, TokenMirror] = {}

    def propose(self, requests: list[Request], limits: list[int]) -> list[list[int]]:
        out = []
        for req, limit in zip(requests, limits):
            h = self._history.get(req.request_id)
            if h is None:
                h = self._history[req.request_id] = TokenMirror(2 * len(req.all_token_ids))
            tokens = h.sync(req.all_token_ids)
            out.append(lookup(tokens, self.min_n, self.max_n, min(self.k, limit)))
        return out

    def finished(self, request_id: str) -> None:
        self._history.pop(request_id, None)
