"""GET /health on the worker's metrics port: is the engine loop alive and going round?

An idle engine does not step, so "a step ran recently" cannot be the test. The loop instead
beats once per iteration: after a step, or after an idle wait for commands (at most 50 ms).
Healthy = the engine thread is alive and its last beat is at most ``max_stall_s`` old; a loop
stuck in a step (a hung kernel, a deadlock) or a dead engine thread answers 503 with the reason.
"""
from __future__ import annotations

import time
from typing import Callable, NamedTuple, Optional


class Health(NamedTuple):
    ok: bool
    reason: str


def engine_loop_health(alive: bool, last_beat: Optional[float], now: float, max_stall_s: float) -> Health:
    """``last_beat`` and ``now`` on the same clock (time.monotonic in the worker)."""
    if not alive:
        return Health(False, "the engine loop thread is not running")
    if last_beat is None:
        return Health(False, "the engine loop has not started an iteration yet")
    age = now - last_beat
    if age > max_stall_s:
        return Health(False, f"the engine loop last came round {age:.0f} s ago (limit {max_stall_s:g} s): "
                             "stuck in a step")
    return Health(True, f"the engine loop came round {age:.2f} s ago")


def engine_loop_checker(loop, max_stall_s: float, clock: Callable[[], float] = time.monotonic) -> Callable[[], Health]:
    """What the metrics server calls per GET /health: ``loop`` is the EngineLoop thread."""
    return lambda: engine_loop_health(loop.is_alive(), loop.last_beat, clock(), max_stall_s)
