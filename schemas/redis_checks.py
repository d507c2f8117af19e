"""What a job queue needs from its Redis, checked and said in plain words:
no eviction (an evicted job record or reply stream is a lost answer) and
persistence (a restart without AOF or snapshots loses every queued job).
Used by the worker at start and by `inferq doctor`."""
from __future__ import annotations

from typing import Any


def _info(r, section: str) -> dict[str, Any]:
    return {(k.decode() if isinstance(k, bytes) else k): v for k, v in r.info(section).items()}


def queue_warnings(r) -> list[str]:
    """Plain-words warnings about ``r``'s configuration; empty when it fits a queue.
    An ACL user without INFO gets one warning saying what to check by hand."""
    try:
        mem, pers = _info(r, "memory"), _info(r, "persistence")
    except Exception as e:  # NOPERM (ACL without INFO) or an old server
        return [f"cannot read Redis INFO ({e}); make sure the server runs with maxmemory-policy noeviction "
                "and appendonly yes"]
    out = []
    policy = str(mem.get("maxmemory_policy", "noeviction"))
    if policy != "noeviction":
        out.append(f"Redis evicts keys under memory pressure (maxmemory-policy {policy}): job records, reply "
                   "streams or the job stream itself can vanish and answers are lost; set maxmemory-policy "
                   "noeviction")
    if int(mem.get("maxmemory", 0) or 0) == 0:
        out.append("Redis has no maxmemory limit: when the machine runs out of memory the kernel kills it; set "
                   "maxmemory with noeviction so writes are refused (and retried) instead")
    aof = int(pers.get("aof_enabled", 0) or 0)
    snapshots = int(pers.get("rdb_saves", 0) or 0) > 0
    if not aof:
        out.append("Redis keeps no append-only file (appendonly no): a restart loses jobs accepted since the "
                   "last snapshot" + ("" if snapshots else ", and no snapshot was ever written") +
                   "; set appendonly yes")
    return out
