"""The queue of one model as lanes: which stream a job waits on, and the list of
streams a worker (or a dashboard) has to look at.

A lane is one Redis stream, named by (partition, priority class, fair-share
tenant, preferred worker). Defaults make one lane per partition (interactive,
shared, anyone's), so a plain deployment has exactly one stream per model.
Batch jobs wait on their class's own lane; with fair share on, each tenant gets
a lane of its own, served in weighted fair order by the worker; a job of a
session that a worker served last waits on that worker's lane, which the worker
reads first and others take from only when they are idle
(gpuworker/service/lanes.py). Lanes beyond the default are recorded in
``keys.lanes`` by the admission script, so readers find them without scanning.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Iterable

from inferq.schemas import keys
from inferq.schemas.text import as_str


@dataclass(frozen=True, order=True)
class Lane:
    model: str
    partition: int = 0
    cls: str = keys.INTERACTIVE
    tenant: str = ""
    owner: str = ""  # the worker this lane's jobs prefer (prefix affinity); "" = anyone

    @property
    def stream(self) -> str:
        return keys.jobs(self.model, self.partition, self.cls, self.tenant, self.owner)

    @property
    def dlq(self) -> str:
        return keys.dlq(self.model, self.partition)

    @property
    def is_default(self) -> bool:
        return self.cls == keys.INTERACTIVE and not self.tenant and not self.owner

    @property
    def class_rank(self) -> int:
        return keys.CLASSES.index(self.cls) if self.cls in keys.CLASSES else len(keys.CLASSES)

    def member(self) -> str:
        """How the lane is recorded in ``keys.lanes``."""
        return json.dumps([self.cls, self.tenant, self.owner])


def lane_of(model: str, job_id: str, cls: str = keys.INTERACTIVE, tenant: str = "", owner: str = "") -> Lane:
    """The lane a job is admitted to: its id picks the partition."""
    return Lane(model, keys.partition_of(job_id), cls, tenant, owner)


def default_lanes(model: str) -> list[Lane]:
    return [Lane(model, p) for p in range(keys.partitions())]


def parse_members(model: str, partition: int, members: Iterable) -> list[Lane]:
    out = []
    for m in members:
        try:
            cls, tenant, *rest = json.loads(as_str(m))
        except (ValueError, TypeError):
            continue  # not ours: ignore rather than fail every reader
        out.append(Lane(model, partition, str(cls), str(tenant), str(rest[0]) if rest else ""))
    return out


def lanes_of(r, model: str) -> list[Lane]:
    """Every lane of a model (sync client): the defaults plus the recorded ones."""
    n = keys.partitions()
    pipe = r.pipeline(transaction=False)
    for p in range(n):
        pipe.smembers(keys.lanes(model, p))
    found = pipe.execute()
    return _merge(model, found)


async def alanes_of(r, model: str) -> list[Lane]:
    """``lanes_of`` with an asyncio client."""
    n = keys.partitions()
    pipe = r.pipeline(transaction=False)
    for p in range(n):
        pipe.smembers(keys.lanes(model, p))
    found = await pipe.execute()
    return _merge(model, found)


def _merge(model: str, found: list) -> list[Lane]:
    lanes = set(default_lanes(model))
    for p, members in enumerate(found):
        lanes.update(parse_members(model, p, members or ()))
    return sorted(lanes, key=lambda ln: (ln.class_rank, ln.tenant, ln.owner, ln.partition))


def models_of_keys(names: Iterable) -> set[str]:
    """Models named by ``inferq:jobs|lanes|dlq:{p}:<model>[::lane]`` keys."""
    out = set()
    for k in names:
        name = keys.name_of(as_str(k))
        if name:
            out.add(name.split("::", 1)[0])
    return out
