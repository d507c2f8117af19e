"""ARCHITECTURE.md's dependency direction.

Statically (an AST scan of every file, so an import inside a function counts as
much as one at the top): ``schemas`` and ``producer`` never import the GPU side,
and ``schemas`` imports nothing of ours. Dynamically (a fresh interpreter): a
web backend imports producer/schemas without torch or gpuworker loading."""
import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
GPU_SIDE = {"gpuworker", "inferq_kernels", "torch", "triton", "transformers"}
OURS = {"schemas", "producer", "gpuworker", "inferq_kernels", "inferq"}


def imported_roots(path: Path) -> set[str]:
    """Top-level names of every module a file imports (relative imports resolve
    to the file's own package)."""
    roots = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            roots.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                roots.add(path.relative_to(ROOT).parts[0])
            elif node.module:
                roots.add(node.module.split(".")[0])
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) in (
                "import_module", "__import__") and node.args and isinstance(node.args[0], ast.Constant):
            roots.add(str(node.args[0].value).split(".")[0])
    return roots


def sources(package: str) -> list[Path]:
    files = sorted((ROOT / package).rglob("*.py"))
    assert files, package
    return files


@pytest.mark.parametrize("package", ["schemas", "producer"])
def test_light_side_never_imports_the_gpu_side(package):
    bad = {str(f.relative_to(ROOT)): sorted(imported_roots(f) & GPU_SIDE) for f in sources(package)}
    assert not {f: m for f, m in bad.items() if m}


def test_schemas_import_nothing_of_ours_statically():
    bad = {str(f.relative_to(ROOT)): sorted(imported_roots(f) & (OURS - {"schemas"})) for f in sources("schemas")}
    assert not {f: m for f, m in bad.items() if m}


def test_producer_imports_only_schemas_of_ours():
    bad = {str(f.relative_to(ROOT)): sorted(imported_roots(f) & (OURS - {"schemas", "producer"}))
           for f in sources("producer")}
    assert not {f: m for f, m in bad.items() if m}


def test_the_scan_sees_lazy_imports(tmp_path):
    f = tmp_path / "probe.py"
    f.write_text("def later():\n    import gpuworker.service\n    from torch import nn\n"
                 "    importlib.import_module('inferq_kernels.checks')\n")
    assert {"gpuworker", "torch", "inferq_kernels"} <= imported_roots(f)

PROBE = r"""
import importlib, pkgutil, sys
roots = sys.argv[1].split(",")
for root in roots:
    pkg = importlib.import_module(root)
    for m in pkgutil.walk_packages(pkg.__path__, root + "."):
        importlib.import_module(m.name)
loaded = set(sys.modules)
print(",".join(sorted(x for x in ("torch", "gpuworker", "inferq_kernels", "producer", "transformers") if x in loaded)))
"""


def loaded_after_importing(roots: str) -> set[str]:
    out = subprocess.run([sys.executable, "-c", PROBE, roots], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return set(filter(None, out.stdout.strip().split(",")))


def test_producer_and_schemas_need_no_torch():
    loaded = loaded_after_importing("schemas,producer")
    assert "torch" not in loaded and "gpuworker" not in loaded and "transformers" not in loaded, loaded


def test_kernels_import_nothing_of_ours():
    loaded = loaded_after_importing("inferq_kernels")
    assert "gpuworker" not in loaded and "producer" not in loaded, loaded


def test_schemas_import_nothing_of_ours():
    loaded = loaded_after_importing("schemas")
    assert loaded.isdisjoint({"gpuworker", "producer", "inferq_kernels", "torch"}), loaded


def test_no_root_of_ours_is_another_distributions_import_name():
    """A top-level package of ours with the import name of an installed dependency shadows
    it (transformers 5.25 pulled Hugging Face's ``kernels`` and broke on our old kernels/)."""
    from importlib.metadata import packages_distributions
    owners = packages_distributions()
    clashes = {root: owners[root] for root in OURS if set(owners.get(root, [])) - {"inferq"}}
    assert not clashes, f"our top-level packages share an import name with: {clashes}"
