"""Redis key names.

Every key that one atomic step (a Lua script, a MULTI) touches shares one hash
tag, so each step lands on one slot of a Redis Cluster. The unit is the
**partition**: ``INFERQ_PARTITIONS`` (N, default 1, the same for every process)
slots over which jobs are spread by their id. A job's stream entry, record,
reply stream, cancel flag, idempotency key, rate bucket and dead letter all
carry its partition's tag; so does the stream (one per *lane*: priority class
and fair-share tenant, see schemas/queues.py) it waits on. Anyone holding a job
id finds its keys from the id alone.

Keys of a model that no script mixes with job keys (live workers, exported
stats, a worker id's lock) keep the model as their tag; a batch's keys use the
batch id.
"""
import os
import zlib
from functools import lru_cache
from typing import Optional

JOBS_GROUP = "inferq-workers"
PREFIX = "inferq"
CLUSTER_SLOTS = 16384

# The name the bundled SmolLM2-135M-Instruct is served under.
DEFAULT_MODEL = "SmolLM2-135M-Instruct"

# Priority classes, best first: a worker takes every waiting job of a class
# before any job of the next (schemas/queues.py).
INTERACTIVE, BATCH = "interactive", "batch"
CLASSES = (INTERACTIVE, BATCH)


# -- partitions ----------------------------------------------------------------
def partitions() -> int:
    """INFERQ_PARTITIONS: how many slots the queue is spread over."""
    raw = os.environ.get("INFERQ_PARTITIONS", "1").strip() or "1"
    try:
        n = int(raw)
    except ValueError:
        raise ValueError(f"INFERQ_PARTITIONS must be a whole number, not {raw!r}") from None
    if not 1 <= n <= 1024:
        raise ValueError(f"INFERQ_PARTITIONS must be between 1 and 1024, not {n}")
    return n


def partition_of(name: str, n: Optional[int] = None) -> int:
    """The partition a job id (or another routing name) belongs to."""
    n = n or partitions()
    return 0 if n == 1 else zlib.crc32(name.encode("utf-8")) % n


def _crc16(data: bytes) -> int:
    """CRC16/XMODEM, the hash Redis Cluster maps keys to slots with."""
    crc = 0
    for byte in data:
        crc ^= byte << 8
        for _ in range(8):
            crc = ((crc << 1) ^ 0x1021) if crc & 0x8000 else crc << 1
            crc &= 0xFFFF
    return crc


def slot_of_tag(tag: str) -> int:
    return _crc16(tag.encode("utf-8")) % CLUSTER_SLOTS


@lru_cache(maxsize=64)
def _tags(n: int) -> tuple[str, ...]:
    """Hash tags of the N partitions, chosen so partition k hashes into the k-th
    equal share of the slot range: a cluster made by ``redis-cli --cluster
    create`` (contiguous slot ranges) then spreads N partitions over its masters
    as evenly as N allows."""
    out = []
    for k in range(n):
        lo, hi = k * CLUSTER_SLOTS // n, (k + 1) * CLUSTER_SLOTS // n
        tag, i = f"p{k}", 0
        while not lo <= slot_of_tag(tag) < hi:
            i += 1
            tag = f"p{k}.{i}"
        out.append(tag)
    return tuple(out)


def tag(partition: int) -> str:
    return _tags(partitions())[partition]


def job_tag(job_id: str) -> str:
    return tag(partition_of(job_id))


# -- the queue -----------------------------------------------------------------
def jobs(model: str, partition: int = 0, cls: str = INTERACTIVE, tenant: str = "", owner: str = "") -> str:
    """The stream of one lane. The default lane (interactive, no fair-share
    tenant, no preferred worker) of partition 0 is ``inferq:jobs:{p0}:<model>``."""
    base = f"{PREFIX}:jobs:{{{tag(partition)}}}:{model}"
    if cls == INTERACTIVE and not tenant and not owner:
        return base
    return f"{base}::{cls}" + (f"::t={tenant}" if tenant else "") + (f"::w={owner}" if owner else "")


def lanes(model: str, partition: int = 0) -> str:
    """Set of a partition's extra lanes (JSON [class, tenant]); admission adds to it."""
    return f"{PREFIX}:lanes:{{{tag(partition)}}}:{model}"


def dlq(model: str, partition: int = 0) -> str:
    return f"{PREFIX}:dlq:{{{tag(partition)}}}:{model}"


def idempotency(model: str, key: str, partition: int = 0) -> str:
    return f"{PREFIX}:idem:{{{tag(partition)}}}:{model}:{key}"


def rate(tenant: str, partition: int = 0) -> str:
    return f"{PREFIX}:rate:{{{tag(partition)}}}:{tenant}"


# -- one job -------------------------------------------------------------------
def reply(job_id: str, in_tag: Optional[str] = None) -> str:
    return f"{PREFIX}:reply:{{{in_tag or job_tag(job_id)}}}:{job_id}"


def cancel(job_id: str, in_tag: Optional[str] = None) -> str:
    return f"{PREFIX}:cancel:{{{in_tag or job_tag(job_id)}}}:{job_id}"


def job_info(job_id: str, in_tag: Optional[str] = None) -> str:
    """Hash with the job's status/model/tenant, so status() needs no stream scan."""
    return f"{PREFIX}:job:{{{in_tag or job_tag(job_id)}}}:{job_id}"


def reader_wake(in_tag: str, reader_id: str) -> str:
    """A tiny stream one gateway reader watches next to the reply streams it
    follows (producer/gateway/reply_hub.py): an entry here makes its blocked
    XREAD return, so a newly followed stream joins the next read at once."""
    return f"{PREFIX}:wake:{{{in_tag}}}:{reader_id}"


# -- per model -----------------------------------------------------------------
def workers(model: str) -> str:
    """Sorted set of live workers (score = last heartbeat, unix seconds)."""
    return f"{PREFIX}:workers:{{{model}}}"


def stats(model: str) -> str:
    """Hash of queue numbers exported by the Celery housekeeping for dashboards."""
    return f"{PREFIX}:stats:{{{model}}}"


def model_info(model: str) -> str:
    """Hash of what a model's workers know of it that the gateway cannot see (its
    ``reasoning_parser``); written at worker start, its TTL renewed by every heartbeat."""
    return f"{PREFIX}:model:{{{model}}}"


MODEL_INFO_TTL_S = 3600


def worker_identity(model: str, worker_id: str) -> str:
    """Held by the one live process using ``worker_id`` (a random token, with a TTL)."""
    return f"{PREFIX}:worker:{{{model}}}:{worker_id}"


def session(model: str, session_id: str) -> str:
    """The worker that last served a session (prefix affinity; a hint with a TTL)."""
    return f"{PREFIX}:session:{{{model}}}:{session_id}"


# -- reading names back ----------------------------------------------------------
def pattern(kind: str) -> str:
    """SCAN pattern for every key of one kind: "jobs", "workers", "dlq", "reply", ..."""
    return f"{PREFIX}:{kind}:*"


def tag_of(key: str) -> Optional[str]:
    """The hash tag of a key: the partition of ``inferq:jobs:{p0}:m``, the model
    of ``inferq:workers:{m}``."""
    start, end = key.find("{"), key.find("}")
    return key[start + 1:end] if 0 <= start < end else None


def name_of(key: str) -> Optional[str]:
    """What follows a partition tag: the model of ``inferq:lanes:{p0}:m`` or
    ``inferq:dlq:{p0}:m``, the job of ``inferq:reply:{p0}:j``."""
    end = key.find("}:")
    return key[end + 2:] if end >= 0 else None


def served_name(model_path: Optional[str]) -> str:
    """The queue name of a model a worker loads from ``model_path`` when no
    served name is given: the bundled model's name, else the folder or file name."""
    if not model_path:
        return DEFAULT_MODEL
    base = os.path.basename(os.path.normpath(model_path))
    return base[:-5] if base.endswith(".gguf") else base


# -- OpenAI Batch API (the gateway's batch driver) ------------------------------
# One hash tag per batch: the batch record, its job map and its driver lease share a slot.
def batch(batch_id: str) -> str:
    """Hash: the batch object (status, timestamps, counts, file ids) and its tenant."""
    return f"{PREFIX}:batch:{{{batch_id}}}"


def batch_jobs(batch_id: str) -> str:
    """Hash custom_id -> job id of every line the driver has enqueued."""
    return f"{PREFIX}:batch:{{{batch_id}}}:jobs"


def batch_lease(batch_id: str) -> str:
    """Held (SET NX EX) by the one gateway process driving the batch."""
    return f"{PREFIX}:batch:{{{batch_id}}}:driver"


def batches() -> str:
    """Sorted set of batch ids by creation time (listing, resume, retention)."""
    return f"{PREFIX}:batches"


# -- webhooks (producer/gateway/webhooks; the record: schemas/completion_events.py) --
def all_tags() -> tuple[str, ...]:
    """The hash tags of every partition (a reader that visits each one)."""
    return _tags(partitions())


def completion_events(in_tag: str) -> str:
    """Stream of a partition's ended jobs and batches, written by the fenced
    final-state scripts only while it exists (a dispatcher's group creates it)."""
    return f"{PREFIX}:events:{{{in_tag}}}"


def webhook_outbox(in_tag: str) -> str:
    """Sorted set of a partition's pending webhook deliveries, scored by when each is due."""
    return f"{PREFIX}:webhooks:outbox:{{{in_tag}}}"


def webhook_delivery(in_tag: str, delivery_id: str) -> str:
    """Hash of one pending delivery (endpoint, body, attempts, last error)."""
    return f"{PREFIX}:webhooks:delivery:{{{in_tag}}}:{delivery_id}"


def webhook_dead(in_tag: str) -> str:
    """List of a partition's deliveries that ran out of attempts (newest first, capped)."""
    return f"{PREFIX}:webhooks:dead:{{{in_tag}}}"


def webhook_recent(in_tag: str) -> str:
    """List of a partition's latest delivery attempts (newest first, capped; the dashboard's table)."""
    return f"{PREFIX}:webhooks:recent:{{{in_tag}}}"


def webhook_endpoints() -> str:
    """Hash endpoint id -> JSON of every endpoint registered through the API."""
    return f"{PREFIX}:webhooks:endpoints"


# -- Responses API (producer/gateway/responses_store.py) --------------------------
def response(job_id: str) -> str:
    """Hash of a stored response: its spec (request echo, input, conversation) and,
    once its job ended, its final output; in the job's slot."""
    return f"{PREFIX}:response:{{{job_tag(job_id)}}}:{job_id}"


def responses_of(tenant: str) -> str:
    """Sorted set of one tenant's stored response job ids by creation time (the bound)."""
    return f"{PREFIX}:responses:{{t={tenant}}}"


def responses_unsaved() -> str:
    """Sorted set of stored responses whose final output is not saved yet (by creation time)."""
    return f"{PREFIX}:responses:unsaved"
