"""POST /v1/embeddings in OpenAI's shape.

Each input becomes its own ``embed`` job: the worker runs its prompt through the
same continuous batch as generations (chunked prefill, paged KV), pools the final
hidden states and publishes the vector in the job's ``done`` event. One job per
input keeps every reply event small (one vector), lets the inputs of one request
spread over workers and batch with anything else queued, and makes a redelivery
redo one input, not all of them.

vLLM-style extras (``extra_body``): ``pooling`` ("mean" | "last"; default the
worker's INFERQ_POOLING), ``normalize`` (L2, default true), ``priority``.
"""
from __future__ import annotations

import time
from typing import Literal, Optional, Union

from fastapi import APIRouter, Depends, Request
from pydantic import BaseModel, ConfigDict, Field

from inferq.schemas.events import embedding_floats
from inferq.schemas.fold import Assembly
from inferq.producer.gateway.auth import authenticate
from inferq.producer.gateway.config import Principal
from inferq.producer.gateway.errors import APIError, bad_request
from inferq.producer.gateway.job_results import results_of
from inferq.producer.gateway.openai_schemas import check_prompt_size
from inferq.producer.gateway.runner import ctx_of, make_job, resolve_model

router = APIRouter()

MAX_INPUTS = 2048  # OpenAI's limit of inputs per request

Input = Union[str, list[str], list[int], list[list[int]]]


class EmbeddingRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    input: Input
    model: Optional[str] = Field(None, max_length=256)
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: Optional[int] = None
    user: Optional[str] = None
    pooling: Optional[Literal["mean", "last"]] = None
    normalize: bool = True
    priority: int = Field(0, ge=-1000, le=1000)

    def inputs(self) -> list[Union[str, list[int]]]:
        """Each input as text or token ids."""
        x = self.input
        if isinstance(x, str):
            items: list = [x]
        elif not x:
            raise bad_request("'input' must not be an empty list", param="input")
        elif all(isinstance(t, int) for t in x):
            items = [x]  # one input as token ids
        else:
            items = list(x)
        if len(items) > MAX_INPUTS:
            raise bad_request(f"'input' has {len(items)} items; at most {MAX_INPUTS} per request", param="input")
        for item in items:
            if len(item) == 0:
                raise bad_request("'input' must not contain an empty string or an empty token list", param="input")
            if not isinstance(item, str) and min(item) < 0:
                raise bad_request("token ids must be non-negative", param="input")
        return items


def vector_body(b64: str, encoding_format: str):
    """The worker's vector (base64 of little-endian float32) as the client asked for it."""
    if encoding_format == "base64":
        return b64  # OpenAI's base64 encoding is exactly these bytes
    return embedding_floats(b64)


@router.post("/v1/embeddings")
async def embeddings(req: EmbeddingRequest, request: Request, principal: Principal = Depends(authenticate)):
    ctx = ctx_of(request)
    if req.dimensions is not None:
        # Truncating a model not trained for it (matryoshka) gives poor vectors; vLLM refuses too.
        raise bad_request("'dimensions' is not supported: the served models give their full hidden size",
                          param="dimensions", code="unsupported_parameter")
    items = req.inputs()
    for item in items:
        if isinstance(item, str):
            check_prompt_size(ctx.settings, text=item)
        else:
            check_prompt_size(ctx.settings, token_ids=item)
    model = await resolve_model(ctx, req.model)
    deadline = time.time() + ctx.settings.request_timeout_s
    embed = {"pooling": req.pooling, "normalize": req.normalize}
    jobs = [make_job(model=model, task="embed", embed=embed, tenant=principal.tenant, deadline=deadline,
                     priority=req.priority, metadata={"route": "embeddings"},
                     **({"prompt": item} if isinstance(item, str) else {"prompt_token_ids": item}))
            for item in items]
    results = await results_of(ctx, request, jobs, route="embeddings")
    data = [{"object": "embedding", "index": i, "embedding": vector_body(_vector(asm), req.encoding_format)}
            for i, asm in enumerate(results)]
    tokens = sum((asm.usage or {}).get("prompt_tokens", 0) for asm in results)
    return {"object": "list", "data": data, "model": model,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}


def _vector(asm: Assembly) -> str:
    if asm.done is None or asm.done.embedding is None:
        # A job ended without a vector: cancelled or past its deadline.
        raise APIError(500 if asm.finish_reason != "deadline" else 504,
                       f"the embedding job ended without a vector (finish reason {asm.finish_reason})",
                       code="embedding_missing", type="server_error")
    return asm.done.embedding
