"""Build a C source of inferq_kernels/cpu once and load it with ctypes.

The system C compiler turns ``<stem>.c`` into ``$INFERQ_CACHE_DIR/cpu_kernels/<stem>_<key>.so``
(default ``~/.cache/inferq``; key: the source, compiler, flags and the CPU's feature flags), so
a changed source, flag or CPU gets a fresh build and an unchanged one costs a ``stat``. Warnings
are on (``-Wall -Wextra``; the sources build clean with gcc 12). This is the same load-on-first-
use scheme as ``torch.utils.cpp_extension.load`` with its own cache dir, without its C++/torch
headers and ninja: these files are plain C, a build takes about a second, and a machine with no
compiler only loses speed. Where there is no compiler, the build or load fails, or
``INFERQ_CPU_KERNELS=0`` is set, ``build`` returns None and the callers keep their torch ops.

Threads: where the compiler can build and link OpenMP (``-fopenmp``, libgomp), every source is
built with it and its kernels split their work over ``kernel_threads(n)`` threads (``sync_threads``
sets n to ``torch.get_num_threads()``); elsewhere the one-thread build (``lib.openmp`` False).
"""
from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import re
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

log = logging.getLogger(__name__)

SOURCE_DIR = Path(__file__).resolve().parent
WARNINGS = ["-Wall", "-Wextra"]


@functools.lru_cache(maxsize=None)
def _cpuinfo(field: str) -> str | None:
    """The value of a /proc/cpuinfo field ("flags", "vendor_id") for the first CPU, or
    None where there is no such file (read once per field: it does not change)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.split(":", 1)[0].strip() == field:
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def cpu_flags() -> str:
    flags = _cpuinfo("flags")
    if flags is not None:
        return flags
    import platform

    return platform.processor() or platform.machine()


def cpu_has(*features: str) -> bool:
    """Whether /proc/cpuinfo lists every one of these flags (e.g. ``amx_bf16``)."""
    flags = set(cpu_flags().split())
    return all(f in flags for f in features)


def cpu_vendor() -> str:
    """/proc/cpuinfo's vendor_id ("GenuineIntel", "AuthenticAMD"), or "" where unknown."""
    return _cpuinfo("vendor_id") or ""


def cache_dir() -> Path:
    # the same root as the GGUF conversions: $INFERQ_CACHE_DIR or ~/.cache/inferq
    return Path(os.environ.get("INFERQ_CACHE_DIR") or Path.home() / ".cache" / "inferq") / "cpu_kernels"


def compiler() -> str | None:
    """The C compiler the kernels are built with: $CC, else cc, gcc or clang on PATH."""
    return os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")


def enabled() -> bool:
    """False where ``INFERQ_CPU_KERNELS=0`` (or false/no/off) turns every C kernel off."""
    return os.environ.get("INFERQ_CPU_KERNELS", "1").lower() not in ("0", "false", "no", "off")


@functools.lru_cache(maxsize=None)
def openmp_flags(cc: str) -> tuple[str, ...]:
    """("-fopenmp",) where ``cc`` builds and links a shared object with OpenMP, else ()."""
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "omp.c"
        src.write_text("#include <omp.h>\nint f(void) { return omp_get_max_threads(); }\n")
        try:
            subprocess.run([cc, "-fopenmp", "-fPIC", "-shared", str(src), "-o", str(Path(tmp) / "omp.so")],
                           check=True, capture_output=True, timeout=60)
            return ("-fopenmp",)
        except (OSError, subprocess.SubprocessError):
            log.info("%s cannot build OpenMP: CPU kernels run on one thread", cc)
            return ()


def sync_threads(lib: ctypes.CDLL) -> None:
    """Make ``lib``'s kernels use ``torch.get_num_threads()`` threads (a no-op when unchanged),
    and pin the calling thread's team as inferq_kernels/cpu/binding.py plans, once per (thread, count)."""
    import torch

    n = torch.get_num_threads()
    if lib.threads != n:
        lib.kernel_threads(n)
        lib.threads = n
    ident = threading.get_ident()
    if _team.get(ident, (0, None))[0] != n:
        _pin(lib, ident, n)


# thread ident -> (team size it was planned for, the CPUs its team is pinned to or None). An
# ident reused by a later thread may leave that thread unpinned: a lost speed-up, not an error.
_team: dict[int, "tuple[int, list[int] | None]"] = {}


def _pin(lib: ctypes.CDLL, ident: int, n: int) -> None:
    from inferq.kernels.cpu import binding

    try:
        cpus = binding.plan(n) if lib.openmp or n == 1 else None
    except ValueError as e:  # the worker checks the setting at start; offline users get a warning
        log.warning("%s; threads not pinned", e)
        cpus = None
    before = _team.get(ident, (0, None))[1]
    if before and binding.ALLOWED:  # pinned for another count before: free that team first
        lib.release_threads((ctypes.c_int * len(binding.ALLOWED))(*binding.ALLOWED), len(binding.ALLOWED),
                            len(before))
    if cpus is not None:
        done = lib.bind_threads((ctypes.c_int * n)(*cpus), n)
        if done != n:
            log.warning("pinned %d of %d compute threads to CPUs %s", done, n, cpus)
        else:
            log.info("compute threads pinned to CPUs %s", cpus)
    _team[ident] = (n, cpus)


# the addresses of every loaded library's team_kernels[] (threads.h): the kernels that share
# their work in a step program's team
_team_kernels: set[int] = set()


def _read_team_kernels(lib: ctypes.CDLL) -> None:
    try:
        listed = ctypes.cast(ctypes.addressof(ctypes.c_void_p.in_dll(lib, "team_kernels")),
                             ctypes.POINTER(ctypes.c_void_p))
    except ValueError:  # the file lists none
        return
    for i in range(4096):
        if not listed[i]:
            break
        _team_kernels.add(listed[i])


def shares_in_team(address: int) -> bool:
    """Whether the kernel at ``address`` takes its share of the work when a step program's team
    calls it (listed in its file's ``team_kernels[]``)."""
    return address in _team_kernels


def pinned_cpus(lib: ctypes.CDLL, n: int) -> list[int]:
    """The CPU each of the calling thread's n team threads is pinned to (-1: not pinned)."""
    out = (ctypes.c_int * n)()
    lib.thread_cpus(out, n)
    return list(out)


def source(stem: str) -> str:
    """The file's text with the shared headers it includes (``#include "<name>.h"`` of this
    folder: threads.h, vec_math.h) inlined: what is hashed is what is built."""
    text = (SOURCE_DIR / f"{stem}.c").read_text()
    return re.sub(r'^#include "(\w+\.h)"\n', lambda m: (SOURCE_DIR / m.group(1)).read_text(), text, flags=re.M)


def build(stem: str, flags: list[str]) -> ctypes.CDLL | None:
    """inferq_kernels/cpu/<stem>.c compiled with ``flags`` (plus warnings, -fPIC -shared) and loaded;
    None, logged, where there is no compiler or the build or load fails."""
    cc = compiler()
    if not cc:
        log.info("no C compiler: %s stays on the torch path", stem)
        return None
    omp = openmp_flags(cc)
    flags = [*flags, *omp, *WARNINGS, "-fPIC", "-shared"]
    try:
        text = source(stem)
    except OSError as e:
        log.warning("CPU kernel source %s missing (%s); using the torch path", stem, e)
        return None
    key = hashlib.sha256("\0".join([text, cc, *flags, cpu_flags()]).encode()).hexdigest()[:16]
    folder = cache_dir()
    path = folder / f"{stem}_{key}.so"
    try:
        if not path.exists():
            folder.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryDirectory(dir=folder) as tmp:
                src = Path(tmp) / f"{stem}.c"
                src.write_text(text)  # the hashed text is the one built
                so = Path(tmp) / f"{stem}.so"
                done = subprocess.run([cc, *flags, str(src), "-o", str(so), "-lm"], check=True,
                                      capture_output=True, timeout=120)
                if done.stderr:
                    log.warning("CPU kernel %s built with warnings:\n%s", stem,
                                done.stderr.decode(errors="replace")[:2000])
                os.replace(so, path)  # atomic: a concurrent builder sees all or nothing
        lib = ctypes.CDLL(str(path))
        lib.kernel_threads.argtypes = [ctypes.c_int]
        lib.kernel_threads.restype = ctypes.c_int
        lib.bind_threads.argtypes = [ctypes.POINTER(ctypes.c_int), ctypes.c_int]
        lib.bind_threads.restype = ctypes.c_int
        lib.release_threads.argtypes = [ctypes.POINTER(ctypes.c_int), ctypes.c_int, ctypes.c_int]
        lib.release_threads.restype = ctypes.c_int
        lib.thread_cpus.argtypes = [ctypes.POINTER(ctypes.c_int), ctypes.c_int]
        lib.thread_cpus.restype = None
        lib.openmp = bool(omp) and lib.kernel_threads(1) == 1 and lib.kernel_threads(2) == 2
        lib.kernel_threads(1)
        lib.threads = 1
        _read_team_kernels(lib)
        return lib
    except Exception as e:  # no usable compiler, read-only cache, a failed load: stay on torch
        detail = getattr(e, "stderr", b"") or b""
        log.warning("CPU kernel %s unavailable (%s %s); using the torch path",
                    stem, e, detail.decode(errors="replace")[:500])
        return None
