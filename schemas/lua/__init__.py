"""The fenced state changes of a job, one Lua script each (BullMQ's pattern).

Every script starts with the ownership checks of ``_owner.lua``: the caller
must still be the entry's consumer in the group's pending list and, where an
attempt is named, the job record's current attempt. See each script's header
for its KEYS and ARGV.
"""
from __future__ import annotations

from functools import lru_cache
from importlib import resources

NAMES = ("claim_attempt", "start", "finish", "fail", "renew", "handback", "request_cancel")


@lru_cache(maxsize=None)
def source(name: str) -> str:
    """The script's text with the ownership prelude in front."""
    if name not in NAMES:
        raise KeyError(f"no fenced script named {name!r}; known: {', '.join(NAMES)}")
    here = resources.files(__name__)
    return here.joinpath("_owner.lua").read_text("utf-8") + "\n" + here.joinpath(f"{name}.lua").read_text("utf-8")
