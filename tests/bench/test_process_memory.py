"""The benchmark's memory readings count a system's child processes (vLLM's engine core)."""
import subprocess
import sys

from inferq.bench.process_memory import process_tree, system_memory

# A parent (as vLLM's front end) whose child (as its engine core) touches 256 MiB, so it is
# resident; both wait for stdin to close. Started from here, the tree is only those two
# (the test process itself may have other children: redis-servers of fixtures).
PARENT = """
import subprocess, sys
child = subprocess.Popen([sys.executable, "-c", sys.argv[1]], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
assert child.stdout.readline().strip() == "ready"
print("ready", child.pid, flush=True)
sys.stdin.read()
child.stdin.close()
child.wait()
"""
CHILD = "import sys; b = bytearray(256 << 20); b[::4096] = b'x' * len(b[::4096]); print('ready', flush=True); sys.stdin.read()"


def test_a_childs_resident_memory_is_counted_with_its_parent_and_not_without():
    parent = subprocess.Popen([sys.executable, "-c", PARENT, CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True)
    try:
        word, child_pid = parent.stdout.readline().split()
        assert word == "ready"
        assert process_tree(parent.pid) == [parent.pid, int(child_pid)]
        with_child = system_memory(parent.pid)
        without = system_memory(parent.pid, include_children=False)
        assert (with_child.processes, without.processes) == (2, 1)
        assert with_child.pss_bytes - without.pss_bytes >= 256 << 20
        assert with_child.peak_bytes - without.peak_bytes >= 256 << 20
        assert without.pss_bytes < 256 << 20  # the parent's own pages only
        assert system_memory(int(child_pid)).pss_bytes >= 256 << 20
    finally:
        parent.stdin.close()
        parent.wait(timeout=30)
