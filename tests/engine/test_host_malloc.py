"""The CPU engine keeps big freed blocks for reuse (gpuworker/engine/host_malloc.py), checked
in fresh processes with the setting and without it (INFERQ_KEEP_FREED_MEMORY=0) by the page
faults of a 40 MB tensor made and freed again and again (each 4 KB page the kernel maps, and
zeroes, again is one minor fault). glibc serves blocks past 32 MB with mmap and unmaps them on
free whatever its dynamic threshold has learnt, so without the setting every round faults in
every page; with it the block comes from the heap and is reused."""
import json
import os
import platform
import subprocess
import sys


ROUNDS = 16
PAGES = 2048 * 5120 * 4 // 4096
PROBE = r"""
import json, resource, sys, torch
from inferq.gpuworker.engine import host_malloc
host_malloc.retain_freed_memory()
out = []
for _ in range(%d):
    f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    t = torch.empty(2048, 5120)  # 40 MB, past glibc's own largest mmap threshold
    t.fill_(1.0)
    small = torch.empty(100, 100)  # something allocated after it, as in a real step
    del t
    out.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0)
print(json.dumps(out))
""" % ROUNDS


def _run(code: str, keep: str, **env_extra: str) -> str:
    env = dict(os.environ, OMP_NUM_THREADS="1", INFERQ_KEEP_FREED_MEMORY=keep, **env_extra)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout.strip().splitlines()[-1]


def _applied(keep: str, **env_extra: str):
    """What retain_freed_memory() returns in a fresh process."""
    return json.loads(_run("import json; from inferq.gpuworker.engine import host_malloc; "
                           "print(json.dumps(host_malloc.retain_freed_memory()))", keep, **env_extra))


def _faults(keep: str) -> list[int]:
    return json.loads(_run(PROBE, keep))


def _glibc() -> bool:
    return platform.libc_ver()[0] == "glibc"


def test_big_freed_blocks_are_reused_not_faulted_in_again():
    if not _glibc():  # musl, macOS: there is no such setting, and nothing is changed
        assert _applied("1") is None
        return
    plain, kept = _faults("0"), _faults("1")
    assert min(plain) > PAGES * 9 // 10, plain  # every round maps the whole block again
    # Kept: after a few rounds the freed block is taken from the heap (glibc may still place
    # an early one at the top of the heap and extend it); overall at most half the faults.
    assert sum(kept) * 2 < sum(plain), (plain, kept)
    assert sum(1 for f in kept if f < PAGES // 20) >= ROUNDS // 4, kept


def test_the_setting_is_left_to_the_user_when_asked():
    """INFERQ_KEEP_FREED_MEMORY=0, or malloc settings of the user's own, change nothing."""
    assert _applied("0") is None
    assert _applied("1", MALLOC_TRIM_THRESHOLD_="1048576") is None
    if _glibc():
        assert _applied("1") is not None
