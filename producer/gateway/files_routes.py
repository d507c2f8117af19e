"""OpenAI Files API (the part the Batch API needs): upload, read, download, delete, list.

Files live in ``INFERQ_GATEWAY_FILES_DIR`` (see files_store). A tenant's key sees
only its own files (404 otherwise); unrestricted keys see all.
"""
from __future__ import annotations

from typing import Optional

import anyio
from fastapi import APIRouter, Depends, File, Form, Request, UploadFile
from fastapi.responses import FileResponse

from inferq.producer.gateway.auth import authenticate, can_access
from inferq.producer.gateway.config import Principal
from inferq.producer.gateway.errors import APIError, bad_request
from inferq.producer.gateway.files_store import FilesStore, FileTooLarge, public

router = APIRouter()

PURPOSES = ("batch",)


def files_of(request: Request) -> FilesStore:
    return request.app.state.batch.files


def owned_file(request: Request, principal: Principal, file_id: str) -> dict:
    meta = files_of(request).get(file_id)
    if meta is None or not can_access(principal, meta.get("tenant")):
        raise APIError(404, f"No such File object: {file_id}", code="file_not_found", param="file_id")
    return meta


def _count_lines(path) -> int:
    n = 0
    with open(path, "rb") as f:
        for raw in f:
            if raw.strip():
                n += 1
    return n


@router.post("/v1/files")
async def upload_file(request: Request, file: UploadFile = File(...), purpose: str = Form(...),
                      principal: Principal = Depends(authenticate)):
    if purpose not in PURPOSES:
        raise bad_request(f"purpose {purpose!r} is not supported; this gateway takes: {', '.join(PURPOSES)}",
                          param="purpose")
    store = files_of(request)
    name = (file.filename or "upload.jsonl").replace("/", "_")[:255]
    try:
        meta = await anyio.to_thread.run_sync(store.save_stream, file.file, name, purpose, principal.tenant)
    except FileTooLarge as e:
        raise APIError(413, str(e), code="file_too_large") from None
    except OSError as e:
        raise APIError(503, f"the gateway cannot store files ({e.strerror}); the operator must make "
                       "INFERQ_GATEWAY_FILES_DIR writable", code="files_unavailable") from None
    limit = request.app.state.ctx.settings.batch_max_lines
    lines = await anyio.to_thread.run_sync(_count_lines, store.data_path(meta["id"]))
    if lines > limit:
        store.delete(meta["id"])
        raise bad_request(f"the file has {lines} lines; a batch input file takes at most {limit}", param="file",
                          code="too_many_lines")
    return public(meta)


@router.get("/v1/files")
async def list_files(request: Request, purpose: Optional[str] = None, principal: Principal = Depends(authenticate)):
    metas = [m for m in files_of(request).all()
             if can_access(principal, m.get("tenant")) and (purpose is None or m["purpose"] == purpose)]
    metas.sort(key=lambda m: (m["created_at"], m["id"]), reverse=True)
    return {"object": "list", "data": [public(m) for m in metas], "has_more": False}


@router.get("/v1/files/{file_id}")
async def get_file(file_id: str, request: Request, principal: Principal = Depends(authenticate)):
    return public(owned_file(request, principal, file_id))


@router.get("/v1/files/{file_id}/content")
async def file_content(file_id: str, request: Request, principal: Principal = Depends(authenticate)):
    meta = owned_file(request, principal, file_id)
    return FileResponse(files_of(request).data_path(file_id), media_type="application/jsonl",
                        filename=meta["filename"])


@router.delete("/v1/files/{file_id}")
async def delete_file(file_id: str, request: Request, principal: Principal = Depends(authenticate)):
    owned_file(request, principal, file_id)
    files_of(request).delete(file_id)
    return {"id": file_id, "object": "file", "deleted": True}
