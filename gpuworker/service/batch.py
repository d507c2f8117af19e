"""A recorded list of Redis commands, sent as one pipeline and re-sent whole
when the connection drops (redis-py forgets a pipeline's commands on error)."""
from __future__ import annotations

import time
from typing import Any, Callable, Optional

import redis

# Redis answers but will not write: out of memory under noeviction, or a replica
# after a failover. Both pass once an operator (or a TTL, or a promotion) frees
# the way, so writers wait with back-off instead of dying.
REFUSING_WRITES = (redis.exceptions.OutOfMemoryError, redis.exceptions.ReadOnlyError)
TRANSIENT = (redis.ConnectionError, redis.TimeoutError, *REFUSING_WRITES)


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
        """Execute; on a connection error, or while Redis refuses writes, retry
        with backoff until it works or ``give_up()`` says stop (then the error is
        raised). Scripts in the batch make a re-send safe (see schemas/lua)."""
        if not self.ops:
            return []
        delay = 0.05
        while True:
            pipe = r.pipeline(transaction=transaction)
            for name, args, kwargs in self.ops:
                getattr(pipe, name)(*args, **kwargs)
            try:
                res = pipe.execute(raise_on_error=False)
            except TRANSIENT as e:
                if give_up is not None and give_up():
                    raise
                _warn(log, e, retry_in=delay)
                time.sleep(delay)
                delay = min(delay * 2, 2.0)
                continue
            refused = next((x for x in res if isinstance(x, REFUSING_WRITES)), None)
            if refused is None or (give_up is not None and give_up()):
                return res
            # A script's write refused inside EXEC (MULTI queued the EVAL itself):
            # the other commands ran, so re-send; fenced scripts make that safe.
            _warn(log, refused, retry_in=delay)
            time.sleep(delay)
            delay = min(delay * 2, 2.0)


def retrying(fn: Callable[[], Any], *, give_up: Callable[[], bool], log=None, what: str = "redis") -> Any:
    """Call ``fn`` until it raises no connection error and no write refusal."""
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
