"""The serve client is producer code: it must load without torch or gpuworker."""
from __future__ import annotations

import subprocess
import sys


def test_bench_serve_client_never_imports_torch():
    code = ("import sys, inferq.bench.cli, inferq.bench.serve, inferq.bench.backends, inferq.bench.plots; "
            "inferq.bench.cli.serve_parser().parse_args([]); "
            "bad = sorted(m for m in sys.modules if m == 'torch' or m.startswith('inferq.gpuworker')); "
            "print(bad); sys.exit(1 if bad else 0)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
