"""inferq/bench is the one home of the benchmarks: scripts/ keeps only the install, test
and GPU-check tools, nothing edits sys.path, and every benchmark module with a main()
is an `inferq bench` command whose --help works without the engine loaded."""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from inferq.bench.commands import BENCHMARKS, module_of

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "inferq" / "bench"
SCRIPTS = {"install.sh", "test.sh", "setup_vllm_peer.sh", "gpu_check.py", "gpu_check.sh"}
# Commands whose --help needs no torch (the others work too, a second slower each).
LIGHT = ("weight-memory", "decode-attention", "host-malloc", "grammar-libs", "queue-overhead", "redis-cost",
         "lanes", "ttft-trace", "gateway-vs-sdk", "serve-vs-vllm", "serve")


def inferq_bench(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "inferq.cli", "bench", *args], capture_output=True, text=True,
                          timeout=120)


def modules_with_main() -> set[str]:
    """inferq/bench modules that define a top-level main() (cli.py is the dispatcher itself)."""
    found = set()
    for path in BENCH.glob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        if path.stem != "cli" and any(isinstance(n, ast.FunctionDef) and n.name == "main" for n in tree.body):
            found.add(path.stem)
    return found


def test_scripts_holds_only_the_tools():
    names = {p.name for p in (ROOT / "scripts").iterdir() if p.name != "__pycache__"}
    assert names == SCRIPTS
    assert not [n for n in names if n.startswith("bench_")]


def test_nothing_edits_sys_path():
    files = [p for folder in ("inferq", "scripts") for p in (ROOT / folder).rglob("*")
             if p.suffix in (".py", ".sh") and "__pycache__" not in p.parts]
    assert len(files) > 20
    # The GPU check is the one exception: it runs from a copy of the checkout that is not
    # installed (the lent GPU machine), and borrows the test suite's kernel helpers.
    edits = [str(p.relative_to(ROOT)) for p in files if "sys.path.insert" in p.read_text(encoding="utf-8")]
    assert edits in ([], ["scripts/gpu_check.py"]), edits


def test_every_benchmark_module_is_listed_by_bench_help():
    listed = inferq_bench("--help")
    assert listed.returncode == 0, listed.stderr
    commands = {line.split()[0] for line in listed.stdout.splitlines() if line.startswith("  ")}
    modules = modules_with_main()
    assert {"offline", "weight_memory", "serve_vs_vllm", "lanes"} <= modules
    assert {m.replace("_", "-") for m in modules} <= commands


def test_every_command_has_a_module_with_main():
    for name in BENCHMARKS:
        if name != "serve":  # parsed by inferq.bench.cli itself
            assert module_of(name).rpartition(".")[2] in modules_with_main(), name


def test_bench_help_loads_no_engine():
    code = ("import sys\nfrom inferq.cli import main\nassert main(['bench', '--help']) == 0\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'transformers') "
            "or m.startswith('inferq.gpuworker')))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().splitlines()[-1] == "[]"


@pytest.mark.parametrize("name", LIGHT)
def test_light_command_help_exits_0(name):
    r = inferq_bench(name, "--help")
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.startswith(f"usage: inferq bench {name}")


def test_unknown_command_lists_the_benchmarks():
    r = inferq_bench("no-such-bench")
    assert r.returncode == 2 and "unknown command 'no-such-bench'" in r.stderr and "weight-memory" in r.stderr
