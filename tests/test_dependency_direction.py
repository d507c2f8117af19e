"""ARCHITECTURE.md's dependency direction, checked in a fresh interpreter:
a web backend imports producer/schemas without torch or gpuworker."""
import subprocess
import sys

PROBE = r"""
import importlib, pkgutil, sys
roots = sys.argv[1].split(",")
for root in roots:
    pkg = importlib.import_module(root)
    for m in pkgutil.walk_packages(pkg.__path__, root + "."):
        importlib.import_module(m.name)
loaded = set(sys.modules)
print(",".join(sorted(x for x in ("torch", "gpuworker", "kernels", "producer", "transformers") if x in loaded)))
"""


def loaded_after_importing(roots: str) -> set[str]:
    out = subprocess.run([sys.executable, "-c", PROBE, roots], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return set(filter(None, out.stdout.strip().split(",")))


def test_producer_and_schemas_need_no_torch():
    loaded = loaded_after_importing("schemas,producer")
    assert "torch" not in loaded and "gpuworker" not in loaded and "transformers" not in loaded, loaded


def test_kernels_import_nothing_of_ours():
    loaded = loaded_after_importing("kernels")
    assert "gpuworker" not in loaded and "producer" not in loaded, loaded


def test_schemas_import_nothing_of_ours():
    loaded = loaded_after_importing("schemas")
    assert loaded.isdisjoint({"gpuworker", "producer", "kernels", "torch"}), loaded
