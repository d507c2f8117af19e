"""Synchronous producer SDK: submit jobs, stream their replies, cancel them.

    from inferq.producer import Producer
    p = Producer()                                  # INFERQ_REDIS_URL or redis://127.0.0.1:6379/0
    h = p.submit("Tell me a joke", sampling={"max_tokens": 64, "temperature": 0})
    for piece in h.text():
        print(piece, end="", flush=True)
    print(h.result().finish_reason)

Imports only ``schemas`` and redis (no torch), so any web backend can use it.
"""
from __future__ import annotations

import contextlib
import re
import time
import warnings
from dataclasses import dataclass, field
from typing import Any, Iterator, Optional, Union

from inferq.schemas import SamplingParams, Timings, Usage, keys, records, transitions
from inferq.schemas.events import embedding_floats
from inferq.schemas.fold import Assembly, Choice
from inferq.schemas.queues import lanes_of
from inferq.schemas.follower import Follow, follow
from inferq.schemas.job import ChatMessage, Job
from inferq.schemas.text import as_str

from inferq.producer.admission import ADMISSION_LUA, admit
from inferq.producer.errors import JobFailed, JobNotFound, JobRestarted
from inferq.producer.settings import ProducerSettings
from inferq.schemas.connection import sync_client

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
    # Every choice by index (sampling.n > 1), choice 0 first; the fields above are choice 0's.
    choices: list[Choice] = field(default_factory=list)
    embedding: Optional[list[float]] = None  # task "embed": the vector
    max_model_len: Optional[int] = None  # task "tokenize": the model's context length


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
    priority_class: str = "interactive",
    deadline: Optional[float] = None,
    idempotency_key: Optional[str] = None,
    metadata: Optional[dict[str, Any]] = None,
    tenant: Optional[str] = None,
    session_id: Optional[str] = None,
    chat_template_kwargs: Optional[dict[str, Any]] = None,
    task: str = "generate",
    embed: Optional[dict] = None,
    tokenize: Optional[dict] = None,
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
        priority_class=priority_class,
        deadline=deadline,
        tenant=tenant,
        session_id=session_id,
        chat_template_kwargs=chat_template_kwargs,
        metadata=metadata or {},
        task=task,
        embed=embed,
        tokenize=tokenize,
    )


def embed_jobs_kw(inputs, pooling: Optional[str], normalize: bool) -> list[dict]:
    """submit() keywords of one ``embed`` job per input (a string, token ids, or a list of them)."""
    if isinstance(inputs, str) or (inputs and all(isinstance(t, int) for t in inputs)):
        inputs = [inputs]
    opts = {"pooling": pooling, "normalize": normalize}
    return [{"task": "embed", "embed": opts, **({"prompt": x} if isinstance(x, str) else {"prompt_token_ids": x})}
            for x in inputs]


class ResultBuilder:
    """Folds accepted events into a JobResult (a new attempt starts over);
    JobFailed on an accepted ``error``."""

    def __init__(self, job_id: str) -> None:
        self.job_id = job_id
        self.fold = Assembly()

    def feed(self, ev) -> Optional[JobResult]:
        asm = self.fold
        asm.feed(ev)
        if asm.error_code is not None:
            raise JobFailed(self.job_id, asm.error_code, asm.error_message or "")
        if asm.done is None:
            return None
        return JobResult(
            job_id=self.job_id,
            text=asm.text,
            token_ids=asm.token_ids,
            finish_reason=asm.done.finish_reason,
            usage=asm.done.usage,
            timings=asm.done.timings,
            logprobs=asm.logprobs if asm.has_logprobs else None,
            attempt=asm.done.attempt,
            prompt_token_ids=asm.prompt_token_ids,
            prompt_logprobs=asm.prompt_logprobs,
            choices=asm.choices(),
            embedding=None if asm.done.embedding is None else embedding_floats(asm.done.embedding),
            max_model_len=asm.done.max_model_len,
        )


class TextFollower:
    """Text pieces for a reader that cannot take text back, over the same fold.
    A redelivered job (new attempt) continues from the tokens already published
    (its ``restarted`` event says where), or regenerates; either is followed
    silently while it agrees with what was already shown; if it diverges,
    JobRestarted is raised."""

    def __init__(self, job_id: str, on_restart: str = "follow") -> None:
        if on_restart not in ("follow", "raise"):
            raise ValueError("on_restart must be 'follow' or 'raise'")
        self.job_id = job_id
        self.on_restart = on_restart
        self.fold = Assembly()
        self.shown = ""

    def feed(self, ev) -> Optional[str]:
        continues = ev.type == "restarted" and ev.resume is not None  # request migration keeps the text
        starts_over = (ev.attempt > self.fold.attempt or ev.type == "restarted") and not continues
        if starts_over and self.shown and self.on_restart == "raise":
            raise JobRestarted(self.job_id, ev.attempt, self.shown)
        self.fold.feed(ev)
        if self.fold.error_code is not None:
            raise JobFailed(self.job_id, self.fold.error_code, self.fold.error_message or "")
        if ev.type != "delta" or not ev.text:
            return None
        current = self.fold.text
        n = min(len(current), len(self.shown))
        if current[:n] != self.shown[:n]:
            raise JobRestarted(self.job_id, ev.attempt, self.shown)
        if len(current) <= len(self.shown):
            return None
        piece = current[len(self.shown):]
        self.shown = current
        return piece


def parse_status(job_id: str, info: dict, cancel_requested: bool) -> dict:
    return {"id": job_id, **records.parse_info(info), "cancel_requested": cancel_requested}


def resolve_settings(settings: Optional[ProducerSettings], **given: Any) -> ProducerSettings:
    """Explicit arguments win over ``settings``, which win over INFERQ_* env."""
    update = {k: v for k, v in given.items() if v is not None}
    if "reply_ttl" in update:
        # The producer's TTL was once called reply_ttl; it is how long a job's keys
        # live while it waits or runs (live_ttl). reply_ttl is the after-done TTL.
        warnings.warn("Producer(reply_ttl=...) is now Producer(live_ttl=...)", DeprecationWarning, stacklevel=3)
        update.setdefault("live_ttl", update.pop("reply_ttl"))
    if settings is None:
        return ProducerSettings(**update)
    if not update:
        return settings
    return ProducerSettings(**{**settings.model_dump(), **update})


def clamp_block_ms(block_ms: int, socket_timeout: float) -> int:
    # A BLOCK longer than the socket timeout would surface as a TimeoutError.
    return max(1, min(int(block_ms), int((socket_timeout - 1.0) * 1000)))


def follow_plan(settings: ProducerSettings, job_id: str, block_ms: int, timeout: Optional[float], raw: bool) -> Follow:
    return Follow(job_id, block_ms=clamp_block_ms(block_ms, settings.socket_timeout), timeout=timeout,
                  reconnect_timeout=settings.reconnect_timeout, raw=raw, missing=lambda: JobNotFound(job_id))


# --- sync client ----------------------------------------------------------------------


class JobHandle:
    """A submitted job. Cheap to create: ``Producer.job(id)`` works from anywhere."""

    def __init__(self, producer: "Producer", job_id: str, *, entry_id: Optional[str] = None, duplicate: bool = False,
                 replicas: Optional[int] = None, replicated: bool = True):
        self._p = producer
        self.id = job_id
        self.entry_id = entry_id
        self.duplicate = duplicate
        # INFERQ_ADMISSION_REPLICAS: replicas that acknowledged the job (None: WAIT
        # off); replicated is False when fewer than asked did (see docs/deploy.md).
        self.replicas = replicas
        self.replicated = replicated

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
        yield from follow(self._p.redis, keys.reply(self.id), follow_plan(self._p.settings, self.id, block_ms, timeout, raw),
                          last_id)

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
        return bool(transitions.request_cancel(r, job_id=self.id, ttl=self._p.settings.live_ttl))

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
        live_ttl: Optional[int] = None,
        settings: Optional[ProducerSettings] = None,
        redis_client=None,
        **overrides: Any,
    ):
        self.settings = resolve_settings(settings, redis_url=redis_url, default_model=default_model,
                                         max_backlog=max_backlog, live_ttl=live_ttl, **overrides)
        self.redis = redis_client if redis_client is not None else sync_client(self.settings)
        self._admit = self.redis.register_script(ADMISSION_LUA)

    @property
    def default_model(self) -> str:
        return self.settings.default_model

    def submit(self, prompt: Optional[str] = None, *, idempotency_key: Optional[str] = None, **kw: Any) -> JobHandle:
        """Validate and enqueue one job. Raises ValueError (pydantic ValidationError)
        for bad input, QueueFull when the backlog is at its bound, RateLimited."""
        job = build_job(self.default_model, prompt, idempotency_key=idempotency_key, **kw)
        adm = admit(self.redis, self._admit, job, idempotency_key, self.settings)
        return JobHandle(self, adm.job_id, entry_id=adm.entry_id, duplicate=adm.duplicate,
                         replicas=adm.replicas, replicated=adm.replicated)

    def job(self, job_id: str) -> JobHandle:
        return JobHandle(self, job_id)

    def embed(self, inputs, *, pooling: Optional[str] = None, normalize: bool = True,
              timeout: Optional[float] = None, **kw: Any) -> list[list[float]]:
        """One vector per input (a string, token ids, or a list of them), in order: one
        ``embed`` job each, run by the workers' continuous batch. JobFailed on a bad input."""
        handles = []
        try:
            for job_kw in embed_jobs_kw(inputs, pooling, normalize):
                handles.append(self.submit(**job_kw, **kw))
            return [h.result(timeout).embedding for h in handles]
        except BaseException:
            for h in handles:  # the rest would be wasted work
                with contextlib.suppress(Exception):
                    h.cancel()
            raise

    def tokenize(self, prompt: Optional[str] = None, *, messages: Optional[list] = None,
                 add_special_tokens: Optional[bool] = None, add_generation_prompt: bool = True,
                 timeout: Optional[float] = None, **kw: Any) -> list[int]:
        """Token ids of ``prompt`` or of ``messages`` under the model's chat template, by a worker."""
        opts = {"add_special_tokens": add_special_tokens, "add_generation_prompt": add_generation_prompt}
        return self.submit(prompt, messages=messages, task="tokenize", tokenize=opts, **kw).result(timeout).token_ids

    def depth(self, model: Optional[str] = None) -> int:
        """Jobs of the model that have not finished (queued + running), all lanes."""
        return sum(int(self.redis.xlen(ln.stream)) for ln in lanes_of(self.redis, model or self.default_model))

    def workers(self, model: Optional[str] = None) -> dict[str, float]:
        """Live workers of a model: worker id -> seconds since its last heartbeat."""
        now = time.time()
        since = now - self.settings.worker_stale_seconds
        rows = self.redis.zrangebyscore(keys.workers(model or self.default_model), since, "+inf", withscores=True)
        return {as_str(w): round(now - score, 3) for w, score in rows}

    def ping(self) -> bool:
        return bool(self.redis.ping())

    def close(self) -> None:
        self.redis.close()

    def __enter__(self) -> "Producer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
