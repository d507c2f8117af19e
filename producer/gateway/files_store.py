"""Files of the OpenAI Files API, kept in a directory (a volume in a container).

Each file is two entries in ``files_dir``: ``<id>.data`` (the bytes) and
``<id>.json`` (the OpenAI file object plus its tenant). The JSON is written
last and atomically (rename), so a half-written upload is never listed.
Retention deletes files older than N days. Blocking file I/O runs off the
event loop (``anyio.to_thread``) where it can be large.
"""
from __future__ import annotations

import json
import logging
import os
import secrets
import time
from pathlib import Path
from typing import BinaryIO, Iterator, Optional

log = logging.getLogger("inferq.gateway.files")

FILE_ID_PREFIX = "file-"
_ID_CHARS = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_")


class FileTooLarge(Exception):
    pass


def new_file_id() -> str:
    return FILE_ID_PREFIX + secrets.token_hex(12)


def valid_id(file_id: str) -> bool:
    """Ids become file names: only our own id alphabet, never a path."""
    return (file_id.startswith(FILE_ID_PREFIX) and 0 < len(file_id) <= 128
            and set(file_id) <= _ID_CHARS)


class FilesStore:
    def __init__(self, root: str | Path, max_bytes: int):
        self.root = Path(root)
        self.max_bytes = max_bytes
        try:
            self.root.mkdir(parents=True, exist_ok=True)
        except OSError as e:  # the gateway still serves everything else; uploads will say why
            log.warning("files directory %s is not usable: %s", self.root, e)

    # -- paths ------------------------------------------------------------
    def data_path(self, file_id: str) -> Path:
        return self.root / f"{file_id}.data"

    def _meta_path(self, file_id: str) -> Path:
        return self.root / f"{file_id}.json"

    def scratch_path(self, name: str) -> Path:
        """A working file (e.g. a batch's partial output) in the same directory."""
        return self.root / name

    # -- write --------------------------------------------------------------
    def save_stream(self, src: BinaryIO, filename: str, purpose: str, tenant: Optional[str],
                    file_id: Optional[str] = None) -> dict:
        """Copy ``src`` into a new file; FileTooLarge past ``max_bytes`` (nothing is kept)."""
        file_id = file_id or new_file_id()
        self.root.mkdir(parents=True, exist_ok=True)
        tmp = self.root / f".{file_id}.upload"
        size = 0
        try:
            with open(tmp, "wb") as out:
                while True:
                    chunk = src.read(1 << 20)
                    if not chunk:
                        break
                    size += len(chunk)
                    if size > self.max_bytes:
                        raise FileTooLarge(f"file exceeds this gateway's limit of {self.max_bytes} bytes")
                    out.write(chunk)
            os.replace(tmp, self.data_path(file_id))
        finally:
            tmp.unlink(missing_ok=True)
        return self._write_meta(file_id, size, filename, purpose, tenant)

    def adopt(self, path: Path, file_id: str, filename: str, purpose: str, tenant: Optional[str]) -> dict:
        """Turn a finished working file into a stored file (idempotent: a second call
        after a crash finds the data already moved)."""
        data = self.data_path(file_id)
        if path.exists():
            os.replace(path, data)
        elif not data.exists():
            data.write_bytes(b"")
        return self._write_meta(file_id, data.stat().st_size, filename, purpose, tenant)

    def _write_meta(self, file_id: str, size: int, filename: str, purpose: str, tenant: Optional[str]) -> dict:
        meta = {"id": file_id, "object": "file", "bytes": size, "created_at": int(time.time()),
                "filename": filename, "purpose": purpose, "status": "processed", "status_details": None,
                "tenant": tenant}
        tmp = self.root / f".{file_id}.json.tmp"
        tmp.write_text(json.dumps(meta))
        os.replace(tmp, self._meta_path(file_id))
        return meta

    # -- read ---------------------------------------------------------------
    def get(self, file_id: str) -> Optional[dict]:
        if not valid_id(file_id):
            return None
        try:
            return json.loads(self._meta_path(file_id).read_text())
        except (FileNotFoundError, ValueError):
            return None

    def all(self) -> Iterator[dict]:
        if not self.root.is_dir():
            return
        for p in self.root.glob(f"{FILE_ID_PREFIX}*.json"):
            meta = self.get(p.name[:-5])
            if meta is not None:
                yield meta

    def delete(self, file_id: str) -> bool:
        if not valid_id(file_id):
            return False
        found = self._meta_path(file_id).exists()
        self._meta_path(file_id).unlink(missing_ok=True)
        self.data_path(file_id).unlink(missing_ok=True)
        return found

    def expire(self, max_age_s: float) -> int:
        """Delete files older than ``max_age_s``; returns how many."""
        cutoff = time.time() - max_age_s
        gone = 0
        for meta in list(self.all()):
            if meta["created_at"] < cutoff and self.delete(meta["id"]):
                gone += 1
        return gone


def public(meta: dict) -> dict:
    """The OpenAI file object (without our tenant field)."""
    return {k: v for k, v in meta.items() if k != "tenant"}
