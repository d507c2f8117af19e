"""A small client for the gateway's OpenAI Batch API (needs ``httpx``).

The official ``openai`` package works against the gateway unchanged
(``OpenAI(base_url="http://gateway:8000/v1", api_key=...)``: ``files.create``,
``batches.create``, ``files.content``). This helper is for code that does not
want that dependency; ``inferq batch ...`` is built on it.

    bc = BatchClient("http://127.0.0.1:8000", api_key="...")
    batch = bc.submit("requests.jsonl", endpoint="/v1/chat/completions")
    batch = bc.wait(batch["id"])
    results = bc.results(batch)          # custom_id -> output line
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any, Callable, Optional

FINAL_STATUSES = ("completed", "failed", "expired", "cancelled")


class BatchError(Exception):
    """The gateway answered with an error (its OpenAI-shaped message)."""

    def __init__(self, status: int, message: str):
        self.status = status
        super().__init__(f"HTTP {status}: {message}")


class BatchClient:
    def __init__(self, url: Optional[str] = None, api_key: Optional[str] = None, timeout: float = 60.0):
        import httpx

        self.url = (url or os.environ.get("INFERQ_GATEWAY_URL") or "http://127.0.0.1:8000").rstrip("/")
        key = api_key if api_key is not None else os.environ.get("INFERQ_API_KEY")
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        self.http = httpx.Client(base_url=self.url, headers=headers, timeout=timeout)

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> "BatchClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _ok(self, resp) -> Any:
        if resp.status_code >= 400:
            try:
                message = resp.json()["error"]["message"]
            except Exception:
                message = resp.text[:500]
            raise BatchError(resp.status_code, message)
        return resp

    # -- files --------------------------------------------------------------
    def upload(self, path: str | Path, purpose: str = "batch") -> dict:
        path = Path(path)
        with open(path, "rb") as f:
            resp = self.http.post("/v1/files", files={"file": (path.name, f, "application/jsonl")},
                                  data={"purpose": purpose})
        return self._ok(resp).json()

    def content(self, file_id: str) -> bytes:
        return self._ok(self.http.get(f"/v1/files/{file_id}/content")).content

    def delete_file(self, file_id: str) -> dict:
        return self._ok(self.http.delete(f"/v1/files/{file_id}")).json()

    # -- batches ------------------------------------------------------------
    def create(self, input_file_id: str, endpoint: str = "/v1/chat/completions",
               metadata: Optional[dict[str, str]] = None, completion_window: str = "24h") -> dict:
        body = {"input_file_id": input_file_id, "endpoint": endpoint, "completion_window": completion_window,
                "metadata": metadata}
        return self._ok(self.http.post("/v1/batches", json=body)).json()

    def submit(self, path: str | Path, endpoint: str = "/v1/chat/completions",
               metadata: Optional[dict[str, str]] = None) -> dict:
        """Upload a JSONL file and create a batch from it."""
        return self.create(self.upload(path)["id"], endpoint, metadata)

    def get(self, batch_id: str) -> dict:
        return self._ok(self.http.get(f"/v1/batches/{batch_id}")).json()

    def list(self, limit: int = 20, after: Optional[str] = None) -> dict:
        params: dict[str, Any] = {"limit": limit}
        if after:
            params["after"] = after
        return self._ok(self.http.get("/v1/batches", params=params)).json()

    def cancel(self, batch_id: str) -> dict:
        return self._ok(self.http.post(f"/v1/batches/{batch_id}/cancel")).json()

    def wait(self, batch_id: str, poll_s: float = 1.0, timeout: Optional[float] = None,
             on_poll: Optional[Callable[[dict], None]] = None) -> dict:
        """Poll until the batch reaches a final status; TimeoutError after ``timeout``."""
        end = None if timeout is None else time.monotonic() + timeout
        while True:
            batch = self.get(batch_id)
            if on_poll:
                on_poll(batch)
            if batch["status"] in FINAL_STATUSES:
                return batch
            if end is not None and time.monotonic() > end:
                raise TimeoutError(f"batch {batch_id} is still {batch['status']} after {timeout}s")
            time.sleep(poll_s)

    def results(self, batch: dict, errors: bool = False) -> dict[Optional[str], dict]:
        """custom_id -> line of the batch's output (or error) file."""
        file_id = batch.get("error_file_id" if errors else "output_file_id")
        if not file_id:
            return {}
        lines = [json.loads(x) for x in self.content(file_id).splitlines() if x.strip()]
        return {x["custom_id"]: x for x in lines}
