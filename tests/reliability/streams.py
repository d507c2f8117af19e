"""Client-side helpers for the chaos tests: stream jobs in threads the way a
user of the SDK would, keeping every raw event for the assertions."""
from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Optional

from inferq.producer.client import TextFollower
from inferq.schemas.fold import ReplyFilter


@dataclass
class Watched:
    """What one streaming client saw."""

    job_id: str
    raw: list = field(default_factory=list)  # every event, repeats and old attempts included
    text: str = ""  # what TextFollower showed, as a user would have printed it
    status: Optional[dict] = None  # job status read right after the stream ended
    error: Optional[BaseException] = None

    @property
    def types(self) -> list[str]:
        return [e.type for e in self.raw]

    def count(self, kind: str) -> int:
        return sum(1 for e in self.raw if e.type == kind)


def watch(handle, timeout: float = 240) -> tuple[Watched, threading.Thread]:
    """Stream ``handle`` in a thread; the returned Watched fills in as it goes."""
    w = Watched(handle.id)

    def run():
        try:
            filt, follower = ReplyFilter(), TextFollower(handle.id)
            for _, ev in handle.stream(timeout=timeout, raw=True):
                w.raw.append(ev)
                if filt.accept(ev):
                    piece = follower.feed(ev)
                    if piece:
                        w.text += piece
            w.status = handle.status()
        except BaseException as e:  # surfaced by the test's assertions
            w.error = e

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return w, t
