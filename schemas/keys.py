"""Redis key names. Braces are Redis Cluster hash tags: every key of one job
(reply stream, cancel flag) hashes to the same slot, and so does every key of
one model's queue."""
import os
from typing import Optional

JOBS_GROUP = "inferq-workers"
PREFIX = "inferq"


def jobs(model: str) -> str:
    return f"{PREFIX}:jobs:{{{model}}}"


def dlq(model: str) -> str:
    return f"{PREFIX}:dlq:{{{model}}}"


def reply(job_id: str) -> str:
    return f"{PREFIX}:reply:{{{job_id}}}"


def cancel(job_id: str) -> str:
    return f"{PREFIX}:cancel:{{{job_id}}}"


def idempotency(model: str, key: str) -> str:
    return f"{PREFIX}:idem:{{{model}}}:{key}"


def job_info(job_id: str) -> str:
    """Hash with the job's status/model/tenant, so status() needs no stream scan."""
    return f"{PREFIX}:job:{{{job_id}}}"


def rate(tenant: str) -> str:
    return f"{PREFIX}:rate:{tenant}"


def workers(model: str) -> str:
    """Sorted set of live workers (score = last heartbeat, unix seconds)."""
    return f"{PREFIX}:workers:{{{model}}}"

# The name the bundled SmolLM2-135M-Instruct is served under.
DEFAULT_MODEL = "SmolLM2-135M-Instruct"


def stats(model: str) -> str:
    """Hash of queue numbers exported by the Celery housekeeping for dashboards."""
    return f"{PREFIX}:stats:{{{model}}}"


def pattern(kind: str) -> str:
    """SCAN pattern for every key of one kind: "jobs", "workers", "dlq", "reply", ..."""
    return f"{PREFIX}:{kind}:*"


def tag_of(key: str) -> Optional[str]:
    """What a key's hash tag names: the model of ``inferq:jobs:{m}``, the job of
    ``inferq:reply:{j}``."""
    start, end = key.find("{"), key.rfind("}")
    return key[start + 1:end] if 0 <= start < end else None


def served_name(model_path: Optional[str]) -> str:
    """The queue name of a model a worker loads from ``model_path`` when no
    served name is given: the bundled model's name, else the folder or file name."""
    if not model_path:
        return DEFAULT_MODEL
    base = os.path.basename(os.path.normpath(model_path))
    return base[:-5] if base.endswith(".gguf") else base


def worker_identity(model: str, worker_id: str) -> str:
    """Held by the one live process using ``worker_id`` (a random token, with a TTL)."""
    return f"{PREFIX}:worker:{{{model}}}:{worker_id}"
