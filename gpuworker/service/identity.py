"""One live process per worker id.

The consumer name is the worker id, and ownership of jobs is checked by
consumer name: two processes sharing one id would pass each other's checks.
So a worker holds ``keys.worker_identity`` (a random token with a TTL of three
leases, renewed with its heartbeat) and refuses to start while another live
process holds it. A predecessor that crashed without releasing it is waited
out (its key expires); one that keeps renewing is alive, and we stop.
"""
from __future__ import annotations

import secrets
import time

from inferq.schemas import keys

# Renew/release only while the key still holds our token.
_RENEW = """
if redis.call("GET", KEYS[1]) == ARGV[1] then
  return redis.call("PEXPIRE", KEYS[1], ARGV[2])
end
return redis.call("SET", KEYS[1], ARGV[1], "PX", ARGV[2], "NX") and 1 or -1
"""
_RELEASE = """
if redis.call("GET", KEYS[1]) == ARGV[1] then
  return redis.call("DEL", KEYS[1])
end
return 0
"""


class WorkerIdInUse(RuntimeError):
    pass


class WorkerIdentity:
    def __init__(self, model: str, worker_id: str, ttl_s: float):
        self.key = keys.worker_identity(model, worker_id)
        self.worker_id = worker_id
        self.token = secrets.token_hex(8)
        self.ttl_ms = max(1000, int(ttl_s * 1000))

    def acquire(self, r, poll_s: float = 0.2) -> None:
        """Take the id, waiting out a dead holder; WorkerIdInUse if a live one renews it."""
        deadline = time.monotonic() + self.ttl_ms / 1000 + 1.0
        last_ttl = None
        while True:
            if r.set(self.key, self.token, px=self.ttl_ms, nx=True):
                return
            ttl = r.pttl(self.key)
            if last_ttl is not None and ttl > last_ttl + 50:  # renewed meanwhile: its holder is alive
                break
            last_ttl = ttl if ttl >= 0 else last_ttl
            if time.monotonic() > deadline:
                break
            time.sleep(poll_s)
        raise WorkerIdInUse(f"worker id {self.worker_id!r} is in use by another live worker process; give this one "
                            "another --worker-id (INFERQ_WORKER_ID), or stop the other one first")

    def renew(self, r) -> bool:
        """False when another process holds the id now (we were presumed dead)."""
        return int(r.eval(_RENEW, 1, self.key, self.token, self.ttl_ms)) != -1

    def release(self, r) -> None:
        r.eval(_RELEASE, 1, self.key, self.token)
