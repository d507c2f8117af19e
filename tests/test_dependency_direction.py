"""ARCHITECTURE.md's dependency direction, in the one import root ``inferq``.

Statically (an AST scan of every file, so an import inside a function counts as
much as one at the top): ``inferq.schemas`` and ``inferq.producer`` never import the
GPU side, ``inferq.schemas`` and ``inferq.kernels`` import nothing of ours, and no
module of ours imports a bare top-level ``schemas``/``producer``/``gpuworker``/
``kernels`` (those names belong to the web app we are installed into). Dynamically
(a fresh interpreter): a web backend imports producer/schemas without torch or the
worker loading."""
import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# folder in the repository -> the layer's import name
LAYERS = {"schemas": "inferq.schemas", "producer": "inferq.producer", "gpuworker": "inferq.gpuworker",
          "inferq_kernels": "inferq.kernels", "inferq": "inferq"}
GPU_SIDE = {"inferq.gpuworker", "inferq.kernels", "torch", "triton", "transformers"}
OURS = {"inferq.schemas", "inferq.producer", "inferq.gpuworker", "inferq.kernels", "inferq"}
BARE = {"schemas", "producer", "gpuworker", "kernels", "inferq_kernels"}


def layer_of(name: str) -> str:
    """``inferq.producer.client`` -> ``inferq.producer``; ``torch.nn`` -> ``torch``."""
    parts = name.split(".")
    if parts[0] == "inferq" and len(parts) > 1 and f"inferq.{parts[1]}" in OURS:
        return f"inferq.{parts[1]}"
    return parts[0]


def imported_layers(path: Path) -> set[str]:
    """The layer of every module a file imports (relative imports resolve to the
    file's own layer)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            found.update(layer_of(a.name) for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                found.add(LAYERS[path.relative_to(ROOT).parts[0]])
            elif node.module == "inferq":  # from inferq import producer / Producer
                found.update(layer_of(f"inferq.{a.name}") for a in node.names)
            elif node.module:
                found.add(layer_of(node.module))
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) in (
                "import_module", "__import__") and node.args and isinstance(node.args[0], ast.Constant):
            found.add(layer_of(str(node.args[0].value)))
    return found


def sources(folder: str) -> list[Path]:
    files = sorted(p for p in (ROOT / folder).rglob("*.py") if "__pycache__" not in p.parts)
    assert files, folder
    return files


def offenders(folder: str, forbidden: set[str]) -> dict[str, list[str]]:
    bad = {str(f.relative_to(ROOT)): sorted(imported_layers(f) & forbidden) for f in sources(folder)}
    return {f: m for f, m in bad.items() if m}


@pytest.mark.parametrize("folder", ["schemas", "producer"])
def test_light_side_never_imports_the_gpu_side(folder):
    assert not offenders(folder, GPU_SIDE)


def test_schemas_import_nothing_of_ours_statically():
    assert not offenders("schemas", OURS - {"inferq.schemas"})


def test_kernels_import_nothing_of_ours_statically():
    assert not offenders("inferq_kernels", OURS - {"inferq.kernels"})


def test_producer_imports_only_schemas_of_ours():
    assert not offenders("producer", OURS - {"inferq.schemas", "inferq.producer"})


def test_gpuworker_imports_only_schemas_and_kernels_of_ours():
    assert not offenders("gpuworker", OURS - {"inferq.schemas", "inferq.kernels", "inferq.gpuworker"})


@pytest.mark.parametrize("folder", list(LAYERS) + ["tests", "scripts"])
def test_nothing_imports_a_bare_top_level_name_of_ours(folder):
    """A web app's own ``schemas.py`` or ``producer.py`` (or Hugging Face's ``kernels``)
    must never be what our code gets."""
    assert not offenders(folder, BARE)


def test_the_scan_sees_lazy_imports(tmp_path):
    f = tmp_path / "probe.py"
    f.write_text("def later():\n    import inferq.gpuworker.service\n    from torch import nn\n"
                 "    importlib.import_module('inferq.kernels.checks')\n    import producer.client\n")
    assert {"inferq.gpuworker", "torch", "inferq.kernels", "producer"} <= imported_layers(f)


PROBE = r"""
import importlib, pkgutil, sys
for root in sys.argv[1].split(","):
    pkg = importlib.import_module(root)
    for m in pkgutil.walk_packages(pkg.__path__, root + "."):
        importlib.import_module(m.name)
loaded = set(sys.modules)
print(",".join(sorted(x for x in ("torch", "inferq.gpuworker", "inferq.kernels", "inferq.producer", "transformers",
                                  "schemas", "producer", "gpuworker", "kernels") if x in loaded)))
"""


def loaded_after_importing(roots: str) -> set[str]:
    out = subprocess.run([sys.executable, "-c", PROBE, roots], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return set(filter(None, out.stdout.strip().split(",")))


def test_producer_and_schemas_need_no_torch():
    loaded = loaded_after_importing("inferq.schemas,inferq.producer")
    assert loaded.isdisjoint({"torch", "inferq.gpuworker", "transformers", "schemas", "producer"}), loaded


def test_kernels_import_nothing_of_ours():
    loaded = loaded_after_importing("inferq.kernels")
    assert loaded.isdisjoint({"inferq.gpuworker", "inferq.producer", "kernels"}), loaded


def test_schemas_import_nothing_of_ours():
    loaded = loaded_after_importing("inferq.schemas")
    assert loaded.isdisjoint({"inferq.gpuworker", "inferq.producer", "inferq.kernels", "torch"}), loaded


def test_inferq_installs_one_top_level_name():
    """Only ``inferq`` is ours at the top level, and no installed dependency owns it."""
    from importlib.metadata import packages_distributions
    owners = packages_distributions()
    ours = sorted(name for name, dists in owners.items() if "inferq" in dists and not name.startswith("_"))
    assert ours == ["inferq"], ours
    assert set(owners["inferq"]) == {"inferq"}, owners["inferq"]
