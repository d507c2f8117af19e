"""Synchronous producer SDK: submit jobs, stream their replies, cancel them.

    from producer import Producer
    p = Producer()                                  # INFERQ_REDIS_URL or redis://127.0.0.1:6379/0
    h = p.submit("Tell me a joke", sampling={"max_tokens": 64, "temperature": 0})
    for piece in h.text():
        print(piece, end="", flush=True)
    print(h.result().finish_reason)

Imports only ``schemas`` and redis (no torch), so any web backend can use it.
"""
from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from typing import Any, Iterator, Optional, Union

import redis

from schemas import SamplingParams, Timings, Usage, decode_event, keys
from schemas.events import TERMINAL_TYPES
from schemas.job import ChatMessage, Job

from producer.admission import ADMISSION_LUA, Admitted, interpret, script_args, script_keys
from producer.errors import JobFailed, JobNotFound, JobRestarted
from producer.settings import ProducerSettings, sync_client

FINAL_STATUSES = frozenset({"done", "error", "cancelled"})
_IDEM_RE = re.compile(r"^[\x21-\x7e]{1,200}$")  # printable ASCII, no spaces


@dataclass
class JobResult:
    job_id: str
    text: str
    token_ids: list[int]
    finish_reason: str
    usage: Usage
    timings: Timings
    logprobs: Optional[list[dict[int, float]]] = None
    attempt: int = 1
    # With sampling.prompt_logprobs: the prompt's ids and one entry per prompt token (None first).
    prompt_token_ids: Optional[list[int]] = None
    prompt_logprobs: Optional[list[Optional[dict[int, float]]]] = None


# --- pure helpers shared with the async client ------------------------------------


def build_job(
    default_model: str,
    prompt: Optional[str] = None,
    *,
    messages: Optional[list[Union[dict, ChatMessage]]] = None,
    prompt_token_ids: Optional[list[int]] = None,
    sampling: Union[SamplingParams, dict, None] = None,
    model: Optional[str] = None,
    priority: int = 0,
    deadline: Optional[float] = None,
    idempotency_key: Optional[str] = None,
    metadata: Optional[dict[str, Any]] = None,
    tenant: Optional[str] = None,
) -> Job:
    """Validate everything before anything is written (ValueError on bad input)."""
    if sampling is None:
        sampling = SamplingParams()
    elif isinstance(sampling, dict):
        sampling = SamplingParams.model_validate(sampling)
    elif not isinstance(sampling, SamplingParams):
        raise TypeError(f"sampling must be SamplingParams, dict or None, not {type(sampling).__name__}")
    if deadline is not None:
        if not isinstance(deadline, (int, float)):
            raise TypeError("deadline must be a unix timestamp (float)")
        if deadline <= time.time():
            raise ValueError(
                f"deadline {deadline} is in the past: it is an absolute unix time, e.g. time.time() + 30"
            )
    if idempotency_key is not None and not _IDEM_RE.match(idempotency_key):
        raise ValueError("idempotency_key must be 1-200 printable ASCII characters without spaces")
    return Job(
        model=model or default_model,
        prompt=prompt,
        messages=messages,
        prompt_token_ids=prompt_token_ids,
        sampling=sampling,
        priority=priority,
        deadline=deadline,
        tenant=tenant,
        metadata=metadata or {},
    )


class ReplyFilter:
    """Drops entries of superseded attempts and repeated (attempt, seq) pairs,
    which a retried publish or a worker that lost its lease may leave behind."""

    def __init__(self) -> None:
        self.attempt = 0
        self.last_seq = -1

    def accept(self, ev) -> bool:
        if ev.attempt < self.attempt:
            return False
        if ev.attempt > self.attempt:
            self.attempt, self.last_seq = ev.attempt, ev.seq
            return True
        if ev.seq <= self.last_seq:
            return False
        self.last_seq = ev.seq
        return True


class ResultBuilder:
    """Collects accepted events into a JobResult; a new attempt starts over."""

    def __init__(self, job_id: str) -> None:
        self.job_id = job_id
        self._reset(0)

    def _reset(self, attempt: int) -> None:
        self.attempt = attempt
        self.parts: list[str] = []
        self.token_ids: list[int] = []
        self.logprobs: Optional[list] = None
        self.prompt_token_ids: Optional[list[int]] = None
        self.prompt_logprobs: Optional[list] = None

    def feed(self, ev) -> Optional[JobResult]:
        if ev.attempt > self.attempt or ev.type == "restarted":
            self._reset(ev.attempt)
        if ev.type == "delta":
            self.parts.append(ev.text)
            self.token_ids.extend(ev.token_ids)
            if ev.logprobs is not None:
                self.logprobs = (self.logprobs or []) + list(ev.logprobs)
            if ev.prompt_logprobs is not None:
                self.prompt_token_ids, self.prompt_logprobs = ev.prompt_token_ids, ev.prompt_logprobs
        elif ev.type == "done":
            return JobResult(
                job_id=self.job_id,
                text="".join(self.parts),
                token_ids=self.token_ids,
                finish_reason=ev.finish_reason,
                usage=ev.usage,
                timings=ev.timings,
                logprobs=self.logprobs,
                attempt=ev.attempt,
                prompt_token_ids=self.prompt_token_ids,
                prompt_logprobs=self.prompt_logprobs,
            )
        elif ev.type == "error":
            raise JobFailed(self.job_id, ev.code, ev.message)
        return None


class TextFollower:
    """Text pieces for a reader that cannot take text back. A redelivered job
    (new attempt) is followed silently while it reproduces what was already
    shown (greedy or seeded jobs do); if it diverges, JobRestarted is raised."""

    def __init__(self, job_id: str, on_restart: str = "follow") -> None:
        if on_restart not in ("follow", "raise"):
            raise ValueError("on_restart must be 'follow' or 'raise'")
        self.job_id = job_id
        self.on_restart = on_restart
        self.shown = ""
        self.current = ""
        self.attempt = 0

    def feed(self, ev) -> Optional[str]:
        if ev.attempt > self.attempt or ev.type == "restarted":
            if self.shown and self.on_restart == "raise":
                raise JobRestarted(self.job_id, ev.attempt, self.shown)
            self.attempt, self.current = ev.attempt, ""
        if ev.type == "error":
            raise JobFailed(self.job_id, ev.code, ev.message)
        if ev.type != "delta" or not ev.text:
            return None
        self.current += ev.text
        n = min(len(self.current), len(self.shown))
        if self.current[:n] != self.shown[:n]:
            raise JobRestarted(self.job_id, ev.attempt, self.shown)
        if len(self.current) <= len(self.shown):
            return None
        piece = self.current[len(self.shown):]
        self.shown = self.current
        return piece


def parse_status(job_id: str, info: dict, cancel_requested: bool) -> dict:
    def s(v):
        return v.decode("utf-8") if isinstance(v, bytes) else v

    d = {s(k): s(v) for k, v in info.items()}
    out: dict[str, Any] = {"id": job_id}
    for k, v in d.items():
        if k in ("attempt", "prompt_tokens", "completion_tokens"):
            out[k] = int(v or 0)
        elif k in ("created_at", "started_at", "finished_at", "deadline"):
            out[k] = float(v) if v else None
        elif k == "tenant":
            out[k] = v or None
        else:
            out[k] = v
    out["cancel_requested"] = cancel_requested
    return out


def resolve_settings(settings: Optional[ProducerSettings], **given: Any) -> ProducerSettings:
    """Explicit arguments win over ``settings``, which win over INFERQ_* env."""
    update = {k: v for k, v in given.items() if v is not None}
    if settings is None:
        return ProducerSettings(**update)
    if not update:
        return settings
    return ProducerSettings(**{**settings.model_dump(), **update})


def clamp_block_ms(block_ms: int, socket_timeout: float) -> int:
    # A BLOCK longer than the socket timeout would surface as a TimeoutError.
    return max(1, min(int(block_ms), int((socket_timeout - 1.0) * 1000)))


def _str(v) -> str:
    return v.decode("utf-8") if isinstance(v, bytes) else str(v)


# --- sync client ----------------------------------------------------------------------


class JobHandle:
    """A submitted job. Cheap to create: ``Producer.job(id)`` works from anywhere."""

    def __init__(self, producer: "Producer", job_id: str, *, entry_id: Optional[str] = None, duplicate: bool = False):
        self._p = producer
        self.id = job_id
        self.entry_id = entry_id
        self.duplicate = duplicate

    def __repr__(self) -> str:
        return f"JobHandle({self.id!r})"

    def _exists(self) -> bool:
        return bool(self._p.redis.exists(keys.reply(self.id), keys.job_info(self.id)))

    def stream(
        self, last_id: str = "0-0", block_ms: int = 5000, timeout: Optional[float] = None, raw: bool = False
    ) -> Iterator[tuple[str, Any]]:
        """Yield ``(entry_id, event)`` from ``last_id`` on, until ``done``/``error``.

        Pass the last entry id you saw to resume after a disconnect. Events of
        superseded attempts and repeats are dropped unless ``raw``.
        """
        if not self._exists():
            raise JobNotFound(self.id)
        r = self._p.redis
        key = keys.reply(self.id)
        block_ms = clamp_block_ms(block_ms, self._p.settings.socket_timeout)
        end = None if timeout is None else time.monotonic() + timeout
        filt = ReplyFilter()
        down_since = None
        while True:
            wait = block_ms
            if end is not None:
                left = end - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"job {self.id} did not finish within {timeout}s")
                wait = max(1, min(block_ms, int(left * 1000)))
            try:
                resp = r.xread({key: last_id}, count=512, block=wait)
                down_since = None
            except (redis.ConnectionError, redis.TimeoutError):
                # Redis restarting or a network blip: resume from the last seen id.
                now = time.monotonic()
                down_since = down_since or now
                if now - down_since > self._p.settings.reconnect_timeout:
                    raise
                delay = min(2.0, 0.1 * 2 ** min(int(now - down_since), 4))
                time.sleep(delay)
                continue
            if not resp:
                if not r.exists(key):
                    raise JobNotFound(self.id)
                continue
            for entry_id, fields in resp[0][1]:
                last_id = _str(entry_id)
                ev = decode_event(fields)
                accepted = filt.accept(ev)
                if accepted or raw:
                    yield last_id, ev
                if accepted and ev.type in TERMINAL_TYPES:
                    return

    def text(self, timeout: Optional[float] = None, on_restart: str = "follow") -> Iterator[str]:
        """Yield text pieces as they arrive (see TextFollower for restarts)."""
        follower = TextFollower(self.id, on_restart)
        for _, ev in self.stream(timeout=timeout):
            piece = follower.feed(ev)
            if piece:
                yield piece

    def result(self, timeout: Optional[float] = None) -> JobResult:
        """Wait for the job; JobFailed on an ``error`` event, TimeoutError on timeout."""
        builder = ResultBuilder(self.id)
        for _, ev in self.stream(timeout=timeout):
            res = builder.feed(ev)
            if res is not None:
                return res
        raise RuntimeError("reply stream ended without done/error")  # stream() only ends on those

    def cancel(self) -> bool:
        """Ask the worker to stop this job. True if it had not finished yet."""
        r = self._p.redis
        if not self._exists():
            raise JobNotFound(self.id)
        pipe = r.pipeline(transaction=False)
        pipe.set(keys.cancel(self.id), "1", ex=self._p.settings.reply_ttl)
        pipe.hget(keys.job_info(self.id), "status")
        _, status = pipe.execute()
        return status is None or _str(status) not in FINAL_STATUSES

    def status(self) -> dict:
        """queued | running | done | error | cancelled, plus attempt, model, tenant, ..."""
        pipe = self._p.redis.pipeline(transaction=False)
        pipe.hgetall(keys.job_info(self.id))
        pipe.exists(keys.cancel(self.id))
        info, cancel = pipe.execute()
        if not info:
            raise JobNotFound(self.id)
        return parse_status(self.id, info, bool(cancel))


class Producer:
    """Enqueues jobs for inferq workers. Thread-safe (redis-py pools connections)."""

    def __init__(
        self,
        redis_url: Optional[str] = None,
        *,
        default_model: Optional[str] = None,
        max_backlog: Optional[int] = None,
        reply_ttl: Optional[int] = None,
        settings: Optional[ProducerSettings] = None,
        redis_client=None,
        **overrides: Any,
    ):
        self.settings = resolve_settings(settings, redis_url=redis_url, default_model=default_model,
                                         max_backlog=max_backlog, reply_ttl=reply_ttl, **overrides)
        self.redis = redis_client if redis_client is not None else sync_client(self.settings)
        self._admit = self.redis.register_script(ADMISSION_LUA)

    @property
    def default_model(self) -> str:
        return self.settings.default_model

    def submit(self, prompt: Optional[str] = None, *, idempotency_key: Optional[str] = None, **kw: Any) -> JobHandle:
        """Validate and enqueue one job. Raises ValueError (pydantic ValidationError)
        for bad input, QueueFull when the backlog is at its bound, RateLimited."""
        job = build_job(self.default_model, prompt, idempotency_key=idempotency_key, **kw)
        reply = self._admit(keys=script_keys(job, idempotency_key), args=script_args(job, idempotency_key, self.settings))
        adm: Admitted = interpret(reply, job, self.settings)
        return JobHandle(self, adm.job_id, entry_id=adm.entry_id, duplicate=adm.duplicate)

    def job(self, job_id: str) -> JobHandle:
        return JobHandle(self, job_id)

    def depth(self, model: Optional[str] = None) -> int:
        """Jobs in the model's stream that have not finished (queued + running)."""
        return int(self.redis.xlen(keys.jobs(model or self.default_model)))

    def workers(self, model: Optional[str] = None) -> dict[str, float]:
        """Live workers of a model: worker id -> seconds since its last heartbeat."""
        now = time.time()
        since = now - self.settings.worker_stale_seconds
        rows = self.redis.zrangebyscore(keys.workers(model or self.default_model), since, "+inf", withscores=True)
        return {_str(w): round(now - score, 3) for w, score in rows}

    def ping(self) -> bool:
        return bool(self.redis.ping())

    def close(self) -> None:
        self.redis.close()

    def __enter__(self) -> "Producer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
