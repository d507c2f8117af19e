"""One batch input line -> a prepared job (or the reason it is refused), and the
output/error line shapes of OpenAI's Batch API."""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Optional

from pydantic import ValidationError

from inferq.producer.gateway.errors import APIError
from inferq.producer.gateway.openai_jobs import Prepared, prepare_chat, prepare_completion
from inferq.producer.gateway.openai_schemas import ChatCompletionRequest, CompletionRequest
from inferq.producer.gateway.runner import Context, resolve_model

ENDPOINTS = {"/v1/chat/completions": (ChatCompletionRequest, prepare_chat),
             "/v1/completions": (CompletionRequest, prepare_completion)}
MAX_CUSTOM_ID = 512


@dataclass
class Line:
    number: int  # 1-based line number in the input file
    request_id: str  # "batch_req_..." (deterministic: a resumed driver writes the same id)
    custom_id: Optional[str]
    prepared: Optional[Prepared] = None
    error: Optional[APIError] = None


def request_id(batch_id: str, number: int) -> str:
    return "batch_req_" + hashlib.sha256(f"{batch_id}:{number}".encode()).hexdigest()[:24]


def _refuse(message: str, code: str = "invalid_request", param: Optional[str] = None) -> APIError:
    return APIError(400, message, code=code, param=param)


async def parse_line(ctx: Context, batch: dict, number: int, raw: bytes, seen: set[str]) -> Line:
    """Validate one line exactly as the endpoint would validate the same request."""
    line = Line(number, request_id(batch["id"], number), None)
    try:
        obj = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as e:
        line.error = _refuse(f"line {number}: not valid JSON ({e})", code="invalid_json")
        return line
    if not isinstance(obj, dict):
        line.error = _refuse(f"line {number}: expected a JSON object")
        return line
    cid = obj.get("custom_id")
    if not isinstance(cid, str) or not cid or len(cid) > MAX_CUSTOM_ID:
        line.error = _refuse(f"line {number}: custom_id must be a non-empty string of at most {MAX_CUSTOM_ID} "
                             "characters", param="custom_id")
        return line
    if cid in seen:
        line.error = _refuse(f"line {number}: duplicate custom_id {cid!r} (custom_id must be unique in a batch)",
                             code="duplicate_custom_id", param="custom_id")
        return line
    seen.add(cid)
    line.custom_id = cid
    if obj.get("method") != "POST":
        line.error = _refuse(f"line {number}: method must be 'POST'", param="method")
        return line
    if obj.get("url") != batch["endpoint"]:
        line.error = _refuse(f"line {number}: url {obj.get('url')!r} must be the batch's endpoint "
                             f"{batch['endpoint']!r}", code="invalid_url", param="url")
        return line
    body = obj.get("body")
    if not isinstance(body, dict):
        line.error = _refuse(f"line {number}: body must be a JSON object", param="body")
        return line
    if body.get("stream"):
        line.error = _refuse(f"line {number}: stream is not supported in a batch", param="body.stream")
        return line
    model_cls, prepare = ENDPOINTS[batch["endpoint"]]
    try:
        req = model_cls.model_validate(body)
    except ValidationError as e:
        problems = "; ".join(f"{'.'.join(map(str, x['loc'])) or 'body'}: {x['msg']}" for x in e.errors())
        line.error = _refuse(f"line {number}: {problems}", param="body")
        return line
    s = ctx.settings
    try:
        line.prepared = await prepare(
            ctx, req, lambda name: resolve_model(ctx, name, require_worker=False),
            tenant=batch.get("tenant") or None, deadline=float(batch["expires_at"]),
            priority=max(-1000, min(1000, s.batch_priority + req.priority)),
            metadata={"class": "batch", "batch_id": batch["id"], "custom_id": cid}, priority_class="batch")
    except APIError as e:
        e.message = f"line {number}: {e.message}"
        line.error = e
    return line


def output_line(line: Line, job_id: str, body: dict) -> dict:
    return {"id": line.request_id, "custom_id": line.custom_id,
            "response": {"status_code": 200, "request_id": job_id, "body": body}, "error": None}


def error_line(line: Line, err: APIError, job_id: Optional[str] = None) -> dict:
    """A line that failed: validation errors carry no response; a request the
    service refused or failed carries the status and body the endpoint would answer."""
    response = None
    if job_id is not None:
        response = {"status_code": err.status, "request_id": job_id, "body": err.body()}
    return {"id": line.request_id, "custom_id": line.custom_id, "response": response,
            "error": {"code": err.code or "error", "message": err.message}}
