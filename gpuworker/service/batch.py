"""A recorded list of Redis commands, sent as one pipeline and re-sent whole
when the connection drops (redis-py forgets a pipeline's commands on error).

On a Redis Cluster the pipeline is not a transaction: its commands go to
several nodes. Every state change the worker makes is one Lua script whose keys
share a hash slot, so each stays atomic on its own; the batch as a whole is
not (nor does it need to be: a re-send is safe, see schemas/lua)."""
from __future__ import annotations

import time
from typing import Any, Callable, Optional

import redis

# The shared tuples (schemas/redis_errors.py): writers wait these out with
# back-off instead of dying; cluster failovers count as well as dropped links.
from inferq.schemas.redis_errors import REFUSING_WRITES, TRANSIENT, is_cluster_client

# Commands that a cluster pipeline (sync redis-py) has no method for, but sends
# fine as a raw command, routed by its first key.
_RAW_ON_CLUSTER = {"eval": "EVAL", "evalsha": "EVALSHA"}


def _warn(log, e: Exception, **kw) -> None:
    if log is None:
        return
    event = "redis_refusing_writes_retrying" if isinstance(e, REFUSING_WRITES) else "redis_unavailable_retrying"
    log.warning(event, error=str(e), **kw)


class Batch:
    def __init__(self) -> None:
        self.ops: list[tuple[str, tuple, dict]] = []

    def __getattr__(self, name: str) -> Callable[..., int]:
        def record(*args: Any, **kwargs: Any) -> int:
            self.ops.append((name, args, kwargs))
            return len(self.ops) - 1  # index of this command's result

        return record

    def __len__(self) -> int:
        return len(self.ops)

    def send(self, r: "redis.Redis", *, transaction: bool = True, give_up: Optional[Callable[[], bool]] = None,
             log=None) -> list:
        """Execute; on a connection error, a cluster between topologies, or while
        Redis refuses writes, retry with backoff until it works or ``give_up()``
        says stop (then the error is raised). Scripts in the batch make a
        re-send safe (see schemas/lua). On a cluster ``transaction`` is ignored
        (see the module docstring)."""
        if not self.ops:
            return []
        delay = 0.05
        while True:
            pipe = self._pipeline(r, transaction)
            try:
                res = pipe.execute(raise_on_error=False)
            except TRANSIENT as e:
                if give_up is not None and give_up():
                    raise
                _warn(log, e, retry_in=delay)
                time.sleep(delay)
                delay = min(delay * 2, 2.0)
                continue
            failed = next((x for x in res if isinstance(x, TRANSIENT)), None)
            if failed is None or (give_up is not None and give_up()):
                return res
            # One command's answer is a refusal or an outage, not a result: a
            # script's write refused inside EXEC (MULTI queued the EVAL itself),
            # or, on a cluster, a node lost mid-pipeline (redis-py puts the
            # error in that command's place once its own retries are spent).
            # The other commands ran, so re-send; fenced scripts make that safe.
            _warn(log, failed, retry_in=delay)
            time.sleep(delay)
            delay = min(delay * 2, 2.0)

    def _pipeline(self, r, transaction: bool):
        """A fresh pipeline holding every recorded command."""
        cluster = is_cluster_client(r)
        pipe = r.pipeline(transaction=transaction and not cluster)
        for name, args, kwargs in self.ops:
            if cluster and name in _RAW_ON_CLUSTER:
                pipe.execute_command(_RAW_ON_CLUSTER[name], *args, **kwargs)
            else:
                getattr(pipe, name)(*args, **kwargs)
        return pipe


def retrying(fn: Callable[[], Any], *, give_up: Callable[[], bool], log=None, what: str = "redis") -> Any:
    """Call ``fn`` until it raises no connection error, cluster outage
    (``TRANSIENT``) or write refusal."""
    delay = 0.05
    while True:
        try:
            return fn()
        except TRANSIENT as e:
            if give_up():
                raise
            _warn(log, e, op=what, retry_in=delay)
            time.sleep(delay)
            delay = min(delay * 2, 2.0)
