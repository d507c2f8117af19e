"""OpenAI response and stream-chunk bodies built from a job's output.

The gateway has no tokenizer, so logprob tokens are named "token_id:<id>"
(the same convention as vLLM's --return-tokens-as-token-ids).
"""
from __future__ import annotations

import time
from typing import Optional

from inferq.schemas.fold import Assembly, Piece


def token_name(token_id: int) -> str:
    return f"token_id:{token_id}"


# JSON has no -Infinity: a token a processed distribution masks reports this (as vLLM does).
_LOGPROB_FLOOR = -9999.0


def _lp(v) -> float:
    return max(float(v), _LOGPROB_FLOOR)


def _top(entry: dict, n: int) -> list[tuple[int, float]]:
    items = sorted(((int(k), _lp(v)) for k, v in entry.items()), key=lambda kv: -kv[1])
    return items[:n]


def _chosen(entry: dict, tid: int) -> float:
    return _lp(entry.get(tid, entry.get(str(tid), 0.0)))


def usage_body(usage: Optional[dict]) -> dict:
    u = usage or {}
    prompt, completion = int(u.get("prompt_tokens", 0)), int(u.get("completion_tokens", 0))
    body = {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}
    if u.get("cached_tokens"):
        body["prompt_tokens_details"] = {"cached_tokens": int(u["cached_tokens"])}
    return body


# -- completions --------------------------------------------------------------
def completion_logprobs(token_ids: list[int], logprobs: Optional[list[dict]], n: int, text_offset: int) -> Optional[dict]:
    if logprobs is None:
        return None
    tokens, chosen, tops, offsets = [], [], [], []
    for tid, entry in zip(token_ids, logprobs):
        tokens.append(token_name(tid))
        chosen.append(_chosen(entry, tid))
        tops.append({token_name(k): v for k, v in _top(entry, n)})
        offsets.append(text_offset)
    return {"tokens": tokens, "token_logprobs": chosen, "top_logprobs": tops, "text_offset": offsets}


def echo_logprobs(asm: Assembly, n: int) -> Optional[dict]:
    """``logprobs`` of an echoed prompt (OpenAI legacy completions, ``echo`` with
    ``logprobs``): the first token has none (null), the rest their prompt logprobs."""
    if asm.prompt_logprobs is None or asm.prompt_token_ids is None:
        return None
    tokens, chosen, tops = [], [], []
    for tid, entry in zip(asm.prompt_token_ids, asm.prompt_logprobs):
        tokens.append(token_name(tid))
        chosen.append(None if entry is None else _chosen(entry, tid))
        tops.append(None if entry is None else {token_name(k): v for k, v in _top(entry, n)})
    return {"tokens": tokens, "token_logprobs": chosen, "top_logprobs": tops, "text_offset": [0] * len(tokens)}


def join_logprobs(first: Optional[dict], second: Optional[dict]) -> Optional[dict]:
    if first is None or second is None:
        return second if first is None else first
    return {k: first[k] + second[k] for k in first}


def prompt_logprobs_body(asm: Assembly, n: int) -> Optional[list]:
    """vLLM's ``prompt_logprobs``: per prompt token None (the first) or
    {token id: {logprob, rank, decoded_token}} for the top ``n`` (rank 1..n)
    plus the actual token (rank null when it is not among them)."""
    if asm.prompt_logprobs is None or asm.prompt_token_ids is None:
        return None
    body: list = []
    for entry in asm.prompt_logprobs:
        if entry is None:
            body.append(None)
            continue
        ranked = _top(entry, len(entry))
        body.append({
            str(k): {"logprob": v, "rank": i + 1 if i < n else None, "decoded_token": token_name(k)}
            for i, (k, v) in enumerate(ranked)
        })
    return body


def completion_response(job_id: str, model: str, asm: Assembly, prefix: str, logprobs_n: Optional[int],
                        echo: bool = False, prompt_logprobs_n: Optional[int] = None) -> dict:
    output_lps = completion_logprobs(asm.token_ids, asm.logprobs if logprobs_n is not None else None,
                                     logprobs_n or 0, len(prefix))
    if echo and logprobs_n is not None:
        output_lps = join_logprobs(echo_logprobs(asm, logprobs_n), output_lps)
    choice = {
        "index": 0,
        "text": prefix + asm.text,
        "logprobs": output_lps,
        "finish_reason": asm.finish_reason,
    }
    if prompt_logprobs_n is not None:
        choice["prompt_logprobs"] = prompt_logprobs_body(asm, prompt_logprobs_n)
    choices = [choice]
    for c in asm.choices()[1:]:  # n > 1: the other choices, each with its own index
        lps = completion_logprobs(c.token_ids, c.logprobs if logprobs_n is not None else None, logprobs_n or 0, len(prefix))
        choices.append({"index": c.index, "text": prefix + c.text, "logprobs": lps, "finish_reason": c.finish_reason})
    return {
        "id": f"cmpl-{job_id}",
        "object": "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": choices,
        "usage": usage_body(asm.usage),
    }


def completion_chunk(job_id: str, model: str, created: int, text: str, finish_reason: Optional[str] = None,
                     logprobs: Optional[dict] = None, include_usage: bool = False, index: int = 0) -> dict:
    chunk = {
        "id": f"cmpl-{job_id}", "object": "text_completion", "created": created, "model": model,
        "choices": [{"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish_reason}],
    }
    if include_usage:
        chunk["usage"] = None
    return chunk


def completion_usage_chunk(job_id: str, model: str, created: int, usage: Optional[dict]) -> dict:
    return {"id": f"cmpl-{job_id}", "object": "text_completion", "created": created, "model": model,
            "choices": [], "usage": usage_body(usage)}


# -- chat ---------------------------------------------------------------------
def chat_logprobs(token_ids: list[int], logprobs: Optional[list[dict]], n: int) -> Optional[dict]:
    if logprobs is None:
        return None
    content = []
    for tid, entry in zip(token_ids, logprobs):
        content.append({
            "token": token_name(tid),
            "logprob": _chosen(entry, tid),
            "bytes": None,
            "top_logprobs": [{"token": token_name(k), "logprob": v, "bytes": None} for k, v in _top(entry, n)],
        })
    return {"content": content}


def chat_response(job_id: str, model: str, asm: Assembly, logprobs_n: Optional[int]) -> dict:
    return {
        "id": f"chatcmpl-{job_id}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{
            "index": c.index,
            "message": {"role": "assistant", "content": c.text},
            "logprobs": chat_logprobs(c.token_ids, c.logprobs, logprobs_n or 0) if logprobs_n is not None else None,
            "finish_reason": c.finish_reason,
        } for c in asm.choices()],
        "usage": usage_body(asm.usage),
    }


def chat_chunk(job_id: str, model: str, created: int, delta: dict, finish_reason: Optional[str] = None,
               logprobs: Optional[dict] = None, include_usage: bool = False, index: int = 0) -> dict:
    chunk = {
        "id": f"chatcmpl-{job_id}", "object": "chat.completion.chunk", "created": created, "model": model,
        "choices": [{"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}],
    }
    if include_usage:
        chunk["usage"] = None
    return chunk


def chat_usage_chunk(job_id: str, model: str, created: int, usage: Optional[dict]) -> dict:
    return {"id": f"chatcmpl-{job_id}", "object": "chat.completion.chunk", "created": created, "model": model,
            "choices": [], "usage": usage_body(usage)}


def piece_logprobs(piece: Piece, kind: str, n: Optional[int], text_offset: int = 0) -> Optional[dict]:
    if n is None or piece.logprobs is None:
        return None
    if kind == "chat":
        return chat_logprobs(piece.token_ids, piece.logprobs, n)
    return completion_logprobs(piece.token_ids, piece.logprobs, n, text_offset)
