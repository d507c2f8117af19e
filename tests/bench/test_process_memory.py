"""The benchmark's memory readings count a system's child processes (vLLM's engine core)."""
import os
import subprocess
import sys

from gpuworker.bench.process_memory import process_tree, system_memory

# A child that touches 256 MiB (so it is resident) and waits to be told to exit.
CHILD = "import sys; b = bytearray(256 << 20); b[::4096] = b'x' * len(b[::4096]); print('ready', flush=True); sys.stdin.read()"


def test_a_childs_resident_memory_is_counted_with_its_parent_and_not_without():
    alone = system_memory(include_children=False)
    child = subprocess.Popen([sys.executable, "-c", CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "ready"
        assert child.pid in process_tree(os.getpid())
        with_child = system_memory()
        without = system_memory(include_children=False)
        assert with_child.processes == without.processes + 1 == 2
        assert with_child.pss_bytes - without.pss_bytes >= 256 << 20
        assert with_child.peak_bytes - without.peak_bytes >= 256 << 20
        assert abs(without.pss_bytes - alone.pss_bytes) < 64 << 20  # the parent did not grow by the child's pages
        assert system_memory(child.pid).pss_bytes >= 256 << 20
    finally:
        child.stdin.close()
        child.wait(timeout=30)
