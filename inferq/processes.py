"""Stopping a child process politely: SIGTERM (a worker drains, redis-server
flushes its AOF), then SIGKILL if it does not exit in time."""
from __future__ import annotations

import subprocess
from typing import Optional


def terminate(proc: subprocess.Popen, timeout: float) -> Optional[int]:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return proc.returncode
