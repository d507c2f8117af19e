"""Resident memory of a benchmarked system, read from /proc (Linux).

A system can be several processes (vLLM's ``LLM`` front end and its engine core), so a
system's memory is summed over a process and its descendants: ``pss`` counts a page
shared by several of them (torch's libraries, a fork's copy-on-write pages) once, split
between them, so the sum is what the system costs the machine; ``peak`` sums each
process's high-water mark (VmHWM), an upper bound on the system's peak.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path


@dataclass
class SystemMemory:
    processes: int
    pss_bytes: int
    peak_bytes: int

    def describe(self) -> str:
        return (f"{gib(self.pss_bytes)} GiB resident (PSS, {self.processes} process"
                f"{'es' if self.processes > 1 else ''}), peak {gib(self.peak_bytes)} GiB")


def gib(nbytes: int) -> str:
    return f"{nbytes / 2**30:.2f}"


def proc_kib(pid: int, name: str, file: str = "status") -> int:
    """A ``name: <n> kB`` line of /proc/<pid>/<file> (VmRSS, VmHWM; Pss in smaps_rollup).
    OSError where the process is gone; LookupError where the file has no such line."""
    for line in Path(f"/proc/{pid}/{file}").read_text().splitlines():
        if line.startswith(name + ":"):
            return int(line.split()[1])
    raise LookupError(f"no {name} in /proc/{pid}/{file}")


def _children(pid: int) -> list[int]:
    out = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            out += [int(c) for c in (task / "children").read_text().split()]
        except FileNotFoundError:  # the thread ended while we looked
            pass
    return out


def process_tree(pid: int) -> list[int]:
    """``pid`` and every live descendant."""
    seen, todo = [], [pid]
    while todo:
        p = todo.pop()
        seen.append(p)
        try:
            todo += _children(p)
        except FileNotFoundError:
            pass
    return seen


def system_memory(pid: int | None = None, *, include_children: bool = True) -> SystemMemory:
    """Memory of ``pid`` (default: this process), with its descendants unless told not to
    (the benchmark's own process holds inferq's engine while vLLM runs as its child)."""
    pid = os.getpid() if pid is None else pid
    pids = process_tree(pid) if include_children else [pid]
    pss = peak = n = 0
    for p in pids:
        try:
            pss += proc_kib(p, "Pss", "smaps_rollup") * 1024
            peak += proc_kib(p, "VmHWM") * 1024
            n += 1
        except OSError:  # it exited between the listing and the read
            pass
    return SystemMemory(n, pss, peak)
