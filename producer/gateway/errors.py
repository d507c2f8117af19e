"""Errors in OpenAI's shape: {"error": {"message", "type", "param", "code"}}.

Every failure the gateway returns goes through here, so clients written for
OpenAI (including the official `openai` package) read them the same way.
"""
from __future__ import annotations

from typing import Optional

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from inferq.schemas.fold import ReplyGap
from inferq.schemas.redis_errors import UNAVAILABLE
from inferq.producer.errors import JobNotFound

_TYPE_BY_STATUS = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
    503: "service_unavailable_error",
}


class APIError(Exception):
    def __init__(self, status: int, message: str, code: Optional[str] = None,
                 param: Optional[str] = None, headers: Optional[dict[str, str]] = None,
                 type: Optional[str] = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code
        self.param = param
        self.headers = headers or {}
        self.type = type or _TYPE_BY_STATUS.get(status, "server_error" if status >= 500 else "invalid_request_error")

    def body(self) -> dict:
        return error_body(self.message, self.type, self.code, self.param)


def error_body(message: str, type: str, code: Optional[str] = None, param: Optional[str] = None) -> dict:
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


def bad_request(message: str, param: Optional[str] = None, code: str = "invalid_request") -> APIError:
    return APIError(400, message, code=code, param=param)


def not_found(message: str, code: str = "not_found") -> APIError:
    return APIError(404, message, code=code)


def error_response(err: APIError) -> JSONResponse:
    return JSONResponse(err.body(), status_code=err.status, headers=err.headers)


def _describe_validation(exc: RequestValidationError) -> tuple[str, Optional[str]]:
    """One readable sentence per problem, with the field path first."""
    parts, first_param = [], None
    for e in exc.errors():
        loc = [str(x) for x in e.get("loc", ()) if x not in ("body",)]
        field = ".".join(loc)
        first_param = first_param or (field or None)
        msg = e.get("msg", "invalid value")
        parts.append(f"{field}: {msg}" if field else msg)
    return "; ".join(parts) or "invalid request", first_param


def job_expired_error(e: Exception) -> APIError:
    # The job's records expired (or were deleted) while a client was reading.
    return APIError(410, str(e), code="job_expired")


def reply_diverged_error(e: Exception) -> APIError:
    # A redelivered job regenerated text that differs from what this stream sent:
    # the stream ends here, never a splice of two generations.
    return APIError(502, str(e), code="reply_diverged")


def reply_gap_error(e: Exception) -> APIError:
    # The job's output was lost in Redis (trimmed or not persisted): an upstream
    # failure, never silently short text.
    return APIError(502, str(e), code="reply_stream_gap")


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError):
        return error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError):
        # OpenAI answers invalid parameters with 400, not FastAPI's 422.
        message, param = _describe_validation(exc)
        return error_response(APIError(400, message, code="invalid_request", param=param))

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException):
        if exc.status_code == 400 and exc.detail == "There was an error parsing the body":
            # FastAPI's words for a body it cannot decode at all (e.g. invalid UTF-8).
            return error_response(bad_request("the request body could not be decoded: send JSON encoded as UTF-8"))
        return error_response(APIError(exc.status_code, str(exc.detail), headers=getattr(exc, "headers", None)))

    async def _redis_down(request: Request, exc: Exception):
        # A Redis outage (or a cluster failover) is temporary: tell clients to
        # retry, not that we are broken.
        return error_response(APIError(503, "the queue (Redis) is unreachable; retry shortly",
                                       code="redis_unavailable", headers={"Retry-After": "2"}))

    for kind in UNAVAILABLE:
        app.add_exception_handler(kind, _redis_down)

    @app.exception_handler(JobNotFound)
    async def _expired(request: Request, exc: JobNotFound):
        return error_response(job_expired_error(exc))

    @app.exception_handler(ReplyGap)
    async def _gap(request: Request, exc: ReplyGap):
        return error_response(reply_gap_error(exc))

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception):
        return error_response(APIError(500, "internal error in the gateway; see its logs", code="internal_error"))
