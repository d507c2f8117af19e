"""Which CPU each compute thread runs on (``INFERQ_CPU_THREADS_BIND``, the worker's
``--cpu-threads-bind``), in the manner of vLLM's ``VLLM_CPU_OMP_THREADS_BIND``.

An OpenMP team ends every kernel at a barrier, so one thread that the scheduler moved onto a
busy core holds the whole step back; pinning thread i of the team to one CPU keeps each on its
own core. The C side (``bind_threads`` in threads.h) pins the calling thread's team; libgomp
keeps one pool per calling thread and torch loads the same libgomp, so torch's parallel regions
of the same size run on the pinned threads too. ``loader.sync_threads`` applies the plan the
first time a thread calls a kernel with a given thread count.

Values:

* ``auto`` (default): with more than one torch thread, one CPU per physical core (SMT
  siblings last), from the NUMA node with the most allowed cores first, taking the *last*
  ones of that order, so the first CPU is the one left to the queue and reply work when the
  worker runs on all cores but one. With one torch thread nothing is pinned (there is no
  barrier to protect, and the OS may keep the thread off whatever core the queue work is on).
* ``off`` (or ``none``, ``nobind``): nothing is pinned.
* a CPU list such as ``0-3,8,10``: thread i on the i-th CPU listed (at least as many CPUs as
  threads; CPUs this process may not use are an error).
"""
from __future__ import annotations

import os
from pathlib import Path

ENV = "INFERQ_CPU_THREADS_BIND"
OFF = ("off", "none", "nobind", "false", "no")  # "0" is CPU 0
_SYS = Path("/sys/devices/system")
# The CPUs this process may use, read before any thread is pinned (a pinned thread's own
# affinity is its one CPU; taskset or a cgroup cpuset shows here).
ALLOWED = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []


def parse_cpu_list(text: str) -> list[int]:
    """``"0-3,8"`` -> ``[0, 1, 2, 3, 8]`` (order kept, duplicates refused)."""
    cpus: list[int] = []
    for part in text.replace(" ", "").split(","):
        if not part:
            continue
        lo, sep, hi = part.partition("-")
        if not lo.isdigit() or (sep and not hi.isdigit()):
            raise ValueError(f"{ENV}: {part!r} is not a CPU number or range (e.g. 0-3,8)")
        first, last = int(lo), int(hi) if sep else int(lo)
        if last < first:
            raise ValueError(f"{ENV}: range {part!r} runs backwards")
        cpus.extend(range(first, last + 1))
    if len(set(cpus)) != len(cpus):
        raise ValueError(f"{ENV}: {text!r} names a CPU twice")
    return cpus


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _topology(cpu: int) -> tuple[int, int]:
    """(NUMA node, physical core id) of a logical CPU; (0, cpu) where sysfs does not say."""
    node = 0
    for entry in (_SYS / "cpu" / f"cpu{cpu}").glob("node*"):
        if entry.name[4:].isdigit():
            node = int(entry.name[4:])
    core = _read(_SYS / "cpu" / f"cpu{cpu}" / "topology" / "core_id")
    package = _read(_SYS / "cpu" / f"cpu{cpu}" / "topology" / "physical_package_id") or "0"
    if not (core and core.isdigit() and package.isdigit()):
        return node, cpu
    return node, (int(package) << 20) + int(core)  # core ids repeat per package


def auto_order(allowed: list[int], topology=_topology) -> tuple[list[list[int]], list[int]]:
    """The allowed CPUs as ``auto`` sees them: per NUMA node (the one with the most cores
    first) one CPU per physical core in CPU order; and the SMT siblings of all those cores."""
    by_node: dict[int, dict[int, list[int]]] = {}
    for cpu in sorted(allowed):
        node, core = topology(cpu)
        by_node.setdefault(node, {}).setdefault(core, []).append(cpu)
    nodes = sorted(by_node, key=lambda n: (-len(by_node[n]), n))
    per_node = [[by_node[n][c][0] for c in sorted(by_node[n], key=lambda c: by_node[n][c][0])] for n in nodes]
    siblings = [cpu for n in nodes for c in sorted(by_node[n]) for cpu in by_node[n][c][1:]]
    return per_node, siblings


def plan(threads: int, spec: str | None = None, allowed: list[int] | None = None,
         topology=_topology) -> list[int] | None:
    """The CPU for each of ``threads`` team threads, or None (nothing pinned). Raises
    ValueError for a list that is malformed, too short or names CPUs this process cannot use."""
    spec = (os.environ.get(ENV, "auto") if spec is None else spec).strip().lower() or "auto"
    if spec in OFF:
        return None
    allowed = ALLOWED if allowed is None else allowed
    if not allowed:
        return None
    if spec == "auto":
        per_node, siblings = auto_order(allowed, topology)
        cores = [c for node in per_node for c in node]
        if threads <= 1 or threads > len(cores) + len(siblings):
            return None  # one thread: no barrier to protect; more threads than CPUs: they would stack
        if threads <= len(per_node[0]):
            # one node's last cores: memory stays local, and its first core is left to the
            # queue and reply work (the worker's default is all cores but one)
            return per_node[0][len(per_node[0]) - threads:]
        return (cores + siblings)[:threads]
    cpus = parse_cpu_list(spec)
    foreign = [c for c in cpus if c not in set(allowed)]
    if foreign:
        raise ValueError(f"{ENV}: CPUs {foreign} are not available to this process (allowed: {allowed})")
    if len(cpus) < threads:
        raise ValueError(f"{ENV}: {len(cpus)} CPUs listed for {threads} threads")
    return cpus[:threads]


def check(spec: str | None = None) -> None:
    """Raise ValueError now for a malformed setting (the worker checks it at start)."""
    plan(1, spec)
