"""How one benchmark request reaches inferq and how its chunks are timed.

- ``redis``: the producer SDK (AsyncProducer) submits the job and follows its
  reply stream; a chunk is a ``delta`` event that carries tokens.
- ``http``: the gateway's OpenAI ``/v1/completions`` with ``stream: true``; a
  chunk is an SSE event whose choice has non-empty text.

Each returns a RequestRecord; the clock starts just before the request is sent.
Failures are recorded, never raised, so one bad request does not end the run.
"""
from __future__ import annotations

import json
import time
from typing import Optional, Protocol

from inferq.bench.datasets import BenchRequest
from inferq.bench.metrics import RequestRecord


def sampling_for(req: BenchRequest) -> dict:
    # Greedy and EOS ignored: every request makes exactly output_len tokens.
    return {"max_tokens": req.output_len, "temperature": 0.0, "ignore_eos": True}


class Backend(Protocol):
    name: str

    async def send(self, req: BenchRequest) -> RequestRecord: ...

    async def close(self) -> None: ...


class RedisBackend:
    name = "redis"

    def __init__(self, redis_url: Optional[str], model: Optional[str], timeout_s: float):
        from inferq.producer import AsyncProducer

        # Every request in flight holds one blocking XREAD; keep the backlog bound out of the way.
        self.producer = AsyncProducer(redis_url, default_model=model, max_backlog=0)
        self.timeout_s = timeout_s

    @property
    def model(self) -> str:
        return self.producer.default_model

    async def check(self) -> None:
        workers = await self.producer.workers()
        if not workers:
            raise RuntimeError(
                f"no live worker serves model {self.model!r} on {self.producer.settings.redis_url} "
                f"(start one with `inferq up` or `inferq worker`, or pass --model)"
            )

    async def send(self, req: BenchRequest) -> RequestRecord:
        kw = {"prompt_token_ids": req.prompt} if isinstance(req.prompt, list) else {"prompt": req.prompt}
        rec = RequestRecord(sent_at=time.perf_counter(), prompt_tokens=req.prompt_len or 0)
        try:
            handle = await self.producer.submit(sampling=sampling_for(req), **kw)
            async for _, ev in handle.stream(timeout=self.timeout_s):
                if ev.type == "restarted":  # a redelivered job starts over; so does the client
                    rec.chunk_times.clear()
                elif ev.type == "delta" and ev.token_ids:
                    rec.chunk_times.append(time.perf_counter())
                elif ev.type == "done":
                    rec.output_tokens = ev.usage.completion_tokens
                    rec.prompt_tokens = ev.usage.prompt_tokens
                    rec.success = ev.finish_reason in ("stop", "length") and bool(rec.chunk_times)
                    if not rec.success:
                        rec.error = f"finish_reason={ev.finish_reason}"
                elif ev.type == "error":
                    rec.error = f"{ev.code}: {ev.message}"
        except Exception as e:  # noqa: BLE001 - any failure is one failed request
            rec.error = f"{type(e).__name__}: {e}"
        return rec

    async def close(self) -> None:
        await self.producer.redis.aclose()


class HTTPBackend:
    name = "http"

    def __init__(self, base_url: str, model: Optional[str], timeout_s: float, api_key: Optional[str] = None):
        import httpx

        self.base_url = base_url.rstrip("/")
        if self.base_url.endswith("/v1"):
            self.base_url = self.base_url[:-3]
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
        self.client = httpx.AsyncClient(timeout=httpx.Timeout(timeout_s, connect=10.0), headers=headers, limits=limits)
        self._model = model

    @property
    def model(self) -> str:
        return self._model or "?"

    async def check(self) -> None:
        r = await self.client.get(f"{self.base_url}/v1/models")
        if r.status_code != 200:
            raise RuntimeError(f"GET {self.base_url}/v1/models answered {r.status_code}: {r.text[:200]}")
        served = [m["id"] for m in r.json().get("data", [])]
        if self._model is None:
            if not served:
                raise RuntimeError(f"the gateway at {self.base_url} serves no model yet (is a worker running?)")
            self._model = served[0]

    async def send(self, req: BenchRequest) -> RequestRecord:
        body = {"model": self.model, "prompt": req.prompt, "stream": True,
                "stream_options": {"include_usage": True}, **sampling_for(req)}
        rec = RequestRecord(sent_at=time.perf_counter(), prompt_tokens=req.prompt_len or 0)
        finish = None
        try:
            async with self.client.stream("POST", f"{self.base_url}/v1/completions", json=body) as resp:
                if resp.status_code != 200:
                    text = (await resp.aread()).decode(errors="replace")
                    rec.error = f"HTTP {resp.status_code}: {text[:200]}"
                    return rec
                async for line in resp.aiter_lines():
                    if not line.startswith("data:"):
                        continue  # blank separators and keep-alive comments
                    data = line[5:].strip()
                    if data == "[DONE]":
                        break
                    chunk = json.loads(data)
                    if "error" in chunk:
                        rec.error = str(chunk["error"].get("message", chunk["error"]))
                        continue
                    for choice in chunk.get("choices") or []:
                        if choice.get("text"):
                            rec.chunk_times.append(time.perf_counter())
                        finish = choice.get("finish_reason") or finish
                    if chunk.get("usage"):
                        rec.output_tokens = chunk["usage"].get("completion_tokens", 0)
                        rec.prompt_tokens = chunk["usage"].get("prompt_tokens", rec.prompt_tokens)
            if not rec.output_tokens:  # a gateway without usage chunks: one token per chunk
                rec.output_tokens = len(rec.chunk_times)
            rec.success = not rec.error and finish in ("stop", "length") and bool(rec.chunk_times)
            if not rec.success and not rec.error:
                rec.error = f"finish_reason={finish}"
        except Exception as e:  # noqa: BLE001
            rec.error = f"{type(e).__name__}: {e}"
        return rec

    async def close(self) -> None:
        await self.client.aclose()
