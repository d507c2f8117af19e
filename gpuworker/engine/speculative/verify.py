"""Acceptance of proposed tokens, from the target model's tokens at each position.

A request that proposed d_1..d_k runs k+1 rows through the forward: the row of
its last known token and one per proposal. Row j gives the target's
distribution p_j for the token after d_1..d_j. Each row is sampled exactly as a
non-speculative step would sample it (same sampler, same parameters); the
request keeps d_1..d_a while the samples agree with the proposals and then the
first sample that does not (or, all agreeing, the sample after d_k). So every
step emits between 1 and k+1 tokens.

Greedy: the sample is the target's argmax, so the output is token for token the
non-speculative one. Sampled: for a proposal that is a single token (n-gram
lookup, or a draft model's argmax), this *is* rejection sampling: d_j is kept
with probability p_j(d_j), and otherwise the token comes from p_j restricted to
tokens other than d_j, renormalised: P(emit x) = p_j(x) for every x, the target
distribution (tests/engine/test_speculative_sampling.py checks it
statistically). A proposer that samples its drafts from a distribution q would
need the min(1, p/q) test instead; none does.

Seeded requests draw output token i from draws keyed by (seed, i)
(engine/keyed_draws.py), so a re-run gives the same tokens however many positions
each step happened to verify.
"""
from __future__ import annotations

from typing import Optional

from inferq.gpuworker.engine.keyed_draws import KeyedDraws


def num_accepted(drafts: list[int], sampled: list[int]) -> int:
    """How many leading drafts the target's samples agree with (``sampled`` has one more entry)."""
    a = 0
    for d, t in zip(drafts, sampled):
        if d != t:
            break
        a += 1
    return a


def expand_rows(reqs: list, num_spec: list[int]) -> tuple[list, list[int]]:
    """One entry per logits row: the request, and how many of its drafts precede that row."""
    rows, offsets = [], []
    for r, ns in zip(reqs, num_spec):
        for j in range(ns + 1):
            rows.append(r)
            offsets.append(j)
    return rows, offsets


def split_rows(token_ids: list[int], logprobs: list, reqs: list, num_spec: list[int]):
    """Per request: the tokens it emits this step, their logprobs, and its proposal size."""
    out_tokens: list = []
    out_lps: list = []
    pos = 0
    for r, ns in zip(reqs, num_spec):
        if ns == 0:
            out_tokens.append(token_ids[pos])
            out_lps.append(logprobs[pos])
            pos += 1
            continue
        sampled = token_ids[pos : pos + ns + 1]
        a = num_accepted(r.spec_token_ids, sampled)
        out_tokens.append(sampled[: a + 1])
        out_lps.append(logprobs[pos : pos + a + 1])
        pos += ns + 1
    return out_tokens, out_lps


def row_generator(req, offset: int) -> Optional[KeyedDraws]:
    """The draws of ``req``'s output token ``offset`` past what it has (None: unseeded)."""
    if req.token_seed is None:
        return None
    return KeyedDraws(req.token_seed, len(req.output_token_ids) + offset)
