"""Request migration: a request that continues tokens an earlier attempt already
generated (and published), as NVIDIA Dynamo migrates a request to a new worker.

The continued tokens join the request as output it already has, exactly as a
preempted request keeps its output: the first schedule computes the prompt and
them (prefix caching makes that cheap where blocks survived), sampling resumes
at the next position, and every per-request state that depends on the output so
far is brought to where the earlier attempt left it: the detokenizer (text shown,
stop-string hold-back), the structured-output matcher (and a reasoning model's
gate in front of it), penalties (they read the
output ids), ``max_tokens`` / ``min_tokens`` (they count them) and seeded draws
(token i is drawn from (seed, i)).
"""
from __future__ import annotations

from typing import Sequence

from inferq.gpuworker.engine.grammar import gate_token


class CannotContinue(ValueError):
    """The earlier attempt's tokens cannot be continued (the caller regenerates)."""


def continue_from(req, token_ids: Sequence[int], vocab_size: int, max_model_len: int) -> str:
    """Make ``req`` (just built, not yet scheduled) continue after ``token_ids``.
    Returns the text those tokens show, which the caller compares with what was
    published. Raises CannotContinue when they could not have been left unfinished."""
    ids = [int(t) for t in token_ids]
    if not ids:
        return ""
    if min(ids) < 0 or max(ids) >= vocab_size:
        raise CannotContinue(f"continued token ids must be in [0, {vocab_size})")
    if len(ids) >= req.max_tokens or req.num_prompt_tokens + len(ids) >= max_model_len:
        raise CannotContinue("the earlier attempt reached its length limit")
    if ids[-1] in req.finishing_token_ids:
        raise CannotContinue("the earlier attempt ended on a stop token")
    if req.matcher is not None or req.reasoning_gate is not None:
        # A reasoning model's tokens pass its gate as they did when generated: the
        # matcher sees only those after the reasoning ended.
        seen: list[int] = []
        for t in ids:
            seen.append(t)
            if req.reasoning_gate is not None and gate_token(req, seen):
                continue
            if req.matcher is not None and not req.matcher.consume_token(t):
                raise CannotContinue("the structured-output constraint refuses the earlier attempt's tokens")
    shown, stop = req.detokenizer.update(ids)
    if stop is not None:
        raise CannotContinue("the earlier attempt's text ends on a stop string")
    req.all_token_ids.extend(ids)
    req.output_token_ids.extend(ids)
    # The prompt's logprobs went out with the earlier attempt's first delta.
    req.prompt_logprobs, req.prompt_logprobs_sent = None, True
    return shown
