"""A recorded list of Redis commands, sent as one pipeline and re-sent whole
when the connection drops (redis-py forgets a pipeline's commands on error)."""
from __future__ import annotations

import time
from typing import Any, Callable, Optional

import redis


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
        """Execute; on a connection error retry with backoff until it works or
        ``give_up()`` says stop (then the error is raised)."""
        if not self.ops:
            return []
        delay = 0.05
        while True:
            pipe = r.pipeline(transaction=transaction)
            for name, args, kwargs in self.ops:
                getattr(pipe, name)(*args, **kwargs)
            try:
                return pipe.execute(raise_on_error=False)
            except (redis.ConnectionError, redis.TimeoutError) as e:
                if give_up is not None and give_up():
                    raise
                if log is not None:
                    log.warning("redis_unavailable_retrying", error=str(e), retry_in=delay)
                time.sleep(delay)
                delay = min(delay * 2, 2.0)


def retrying(fn: Callable[[], Any], *, give_up: Callable[[], bool], log=None, what: str = "redis") -> Any:
    """Call ``fn`` until it does not raise a Redis connection error."""
    delay = 0.05
    while True:
        try:
            return fn()
        except (redis.ConnectionError, redis.TimeoutError) as e:
            if give_up():
                raise
            if log is not None:
                log.warning("redis_unavailable_retrying", op=what, error=str(e), retry_in=delay)
            time.sleep(delay)
            delay = min(delay * 2, 2.0)
