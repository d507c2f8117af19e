"""POST /tokenize and /detokenize in vLLM's shapes, with the served model's own
tokenizer and chat template.

The gateway has no model files (it never loads a model), so each request is a
``tokenize`` / ``detokenize`` job on the model's queue: a worker answers it at
intake with its tokenizer, without an engine step, so it costs a queue round trip
and never waits behind generations in the batch.
"""
from __future__ import annotations

import time
from typing import Any, Optional

from fastapi import APIRouter, Depends, Request
from pydantic import BaseModel, ConfigDict, Field

from inferq.producer.gateway.auth import authenticate
from inferq.producer.gateway.config import Principal
from inferq.producer.gateway.errors import bad_request
from inferq.producer.gateway.job_results import results_of
from inferq.producer.gateway.openai_schemas import ChatMessageIn, check_prompt_size
from inferq.producer.gateway.runner import ctx_of, make_job, resolve_model

router = APIRouter()


class TokenizeRequest(BaseModel):
    """``prompt`` (vLLM's TokenizeCompletionRequest) or ``messages`` (TokenizeChatRequest)."""

    model_config = ConfigDict(extra="ignore")

    model: Optional[str] = Field(None, max_length=256)
    prompt: Optional[str] = None
    messages: Optional[list[ChatMessageIn]] = Field(None, min_length=1)
    add_special_tokens: Optional[bool] = None  # default: true for a prompt, false for messages
    add_generation_prompt: bool = True
    # vLLM fields this gateway does not implement: refused rather than ignored.
    return_token_strs: Optional[bool] = None
    continue_final_message: Optional[bool] = None
    tools: Optional[list[Any]] = None
    chat_template: Optional[str] = None


class DetokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: Optional[str] = Field(None, max_length=256)
    tokens: list[int]


@router.post("/tokenize")
async def tokenize(req: TokenizeRequest, request: Request, principal: Principal = Depends(authenticate)):
    ctx = ctx_of(request)
    for name in ("return_token_strs", "continue_final_message", "tools", "chat_template"):
        if getattr(req, name):
            raise bad_request(f"'{name}' is not supported by /tokenize here", param=name, code="unsupported_parameter")
    if (req.prompt is None) == (req.messages is None):
        raise bad_request("give exactly one of 'prompt' or 'messages'", param="prompt")
    messages = None if req.messages is None else [m.job_message() for m in req.messages]
    check_prompt_size(ctx.settings, text=req.prompt, messages=messages)
    model = await resolve_model(ctx, req.model)
    options = {"add_special_tokens": req.add_special_tokens, "add_generation_prompt": req.add_generation_prompt}
    job = make_job(model=model, task="tokenize", prompt=req.prompt, messages=messages, tokenize=options,
                   tenant=principal.tenant, deadline=time.time() + ctx.settings.request_timeout_s,
                   metadata={"route": "tokenize"})
    (asm,) = await results_of(ctx, request, [job], route="tokenize")
    return {"count": len(asm.token_ids), "max_model_len": asm.done.max_model_len if asm.done else None,
            "tokens": asm.token_ids, "token_strs": None}


@router.post("/detokenize")
async def detokenize(req: DetokenizeRequest, request: Request, principal: Principal = Depends(authenticate)):
    ctx = ctx_of(request)
    if any(t < 0 for t in req.tokens):
        raise bad_request("token ids must be non-negative", param="tokens")
    check_prompt_size(ctx.settings, token_ids=req.tokens)
    model = await resolve_model(ctx, req.model)
    if not req.tokens:
        return {"prompt": ""}
    job = make_job(model=model, task="detokenize", prompt_token_ids=req.tokens, tenant=principal.tenant,
                   deadline=time.time() + ctx.settings.request_timeout_s, metadata={"route": "detokenize"})
    (asm,) = await results_of(ctx, request, [job], route="detokenize")
    return {"prompt": asm.text}
