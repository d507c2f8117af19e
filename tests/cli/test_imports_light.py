"""The producer side (gateway, CLI, Celery, `up`) must import without torch or
the worker: web backends and the slim image install it without them."""
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

MODULES = ["inferq.cli", "inferq.up", "inferq.doctor", "inferq.producer.gateway", "inferq.producer.gateway.app",
           "inferq.producer.celery_app", "inferq.producer.celery_tasks", "inferq.producer.maintenance", "inferq.embedded_redis",
           "inferq.cli_jobs", "inferq.cli_queue", "inferq.producer.queue_stats", "inferq.cli_batch", "inferq.producer.batch"]


def test_producer_modules_do_not_import_torch_or_the_worker():
    code = ("import importlib, sys\n"
            f"for m in {MODULES!r}: importlib.import_module(m)\n"
            "from inferq.producer.gateway import create_app; create_app()\n"
            "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'transformers') or m.startswith('inferq.gpuworker'))\n"
            "print(bad)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]"
