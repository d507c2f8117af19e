"""Process helpers for tests that start `inferq` commands (Linux /proc)."""
from __future__ import annotations

import os
import threading
import time
from pathlib import Path


def children_of(pid: int) -> set[int]:
    """All live descendants of ``pid``."""
    parents: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        parents.setdefault(ppid, []).append(int(entry.name))
    out, todo = set(), [pid]
    while todo:
        for child in parents.get(todo.pop(), []):
            if child not in out:
                out.add(child)
                todo.append(child)
    return out


def running(pid: int) -> bool:
    """True if ``pid`` exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


class LineReader:
    """Collects a process's stdout lines in a thread; wait_for() a marker."""

    def __init__(self, stream):
        self.lines: list[str] = []
        self._cv = threading.Condition()
        self._t = threading.Thread(target=self._pump, args=(stream,), daemon=True)
        self._t.start()

    def _pump(self, stream):
        for raw in iter(stream.readline, ""):
            with self._cv:
                self.lines.append(raw.rstrip("\n"))
                self._cv.notify_all()
        with self._cv:
            self.lines.append("<EOF>")
            self._cv.notify_all()

    def wait_for(self, prefix: str, timeout: float) -> str:
        end = time.monotonic() + timeout
        with self._cv:
            while True:
                for line in self.lines:
                    if line.startswith(prefix):
                        return line
                    if line == "<EOF>":
                        raise AssertionError("process ended before printing " + prefix + ":\n" + self.text())
                left = end - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"no line starting with {prefix!r} within {timeout}s:\n" + self.text())
                self._cv.wait(left)

    def text(self) -> str:
        return "\n".join(self.lines)


def env_without(*names: str, **extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in names}
    env.update(extra)
    return env
