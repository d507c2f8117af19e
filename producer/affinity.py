"""Prefix affinity across workers: jobs of one session go to the lane of the
worker that served the session last, whose prefix cache holds its prompt.

A session is the job's ``session_id``, or (with INFERQ_AFFINITY_PREFIX_CHARS
set) one derived from the first that many characters of a longer prompt, so
requests that share a long system prompt or document meet on one worker. The
worker records ``keys.session`` when it starts a session's job; the mapping is
a hint with a TTL: read here before admission, never trusted for correctness
(any worker may run any job; an idle one takes from another's lane).
"""
from __future__ import annotations

import hashlib
from typing import Optional

from inferq.schemas import keys
from inferq.schemas.job import Job
from inferq.schemas.text import as_str

from inferq.producer.settings import ProducerSettings


def _prompt_text(job: Job) -> str:
    if job.prompt is not None:
        return job.prompt
    if job.messages:
        return "\n".join(m.content for m in job.messages)
    return ""


def with_session(job: Job, s: ProducerSettings) -> Job:
    """The job with a derived session id when it has none and its prompt is long."""
    n = s.affinity_prefix_chars
    if job.session_id or not n:
        return job
    if job.prompt_token_ids is not None:
        head = ",".join(map(str, job.prompt_token_ids[: max(1, n // 4)])) if len(job.prompt_token_ids) > n // 4 else ""
    else:
        text = _prompt_text(job)
        head = text[:n] if len(text) > n else ""
    if not head:
        return job
    return job.model_copy(update={"session_id": "prefix-" + hashlib.sha1(head.encode("utf-8")).hexdigest()[:20]})


def preferred_worker(r, job: Job) -> str:
    if not job.session_id:
        return ""
    owner = r.get(keys.session(job.model, job.session_id))
    return as_str(owner) if owner else ""


async def apreferred_worker(r, job: Job) -> str:
    if not job.session_id:
        return ""
    owner = await r.get(keys.session(job.model, job.session_id))
    return as_str(owner) if owner else ""


def session_key(job: Job) -> Optional[str]:
    return keys.session(job.model, job.session_id) if job.session_id else None
