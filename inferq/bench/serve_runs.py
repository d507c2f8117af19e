"""What the serving comparisons (``gateway-vs-sdk``, ``serve-vs-vllm``) share: waiting
for a server they started, and one ``inferq bench serve`` run in a child process whose
printed summary is kept beside its JSON result."""
from __future__ import annotations

import subprocess
import sys
import time
import urllib.request
from pathlib import Path


def wait_http(url: str, proc: subprocess.Popen, timeout_s: float, log: Path) -> None:
    """Until ``url`` answers 2xx; raises if ``proc`` exits first or time runs out."""
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        try:
            with urllib.request.urlopen(url, timeout=5):
                return
        except OSError:  # refused, reset, or an HTTP error while it starts
            pass
        if proc.poll() is not None:
            raise RuntimeError(f"server exited ({proc.returncode}); see {log}")
        time.sleep(1)
    raise TimeoutError(f"{url} did not answer in {timeout_s:.0f} s; see {log}")


def bench_serve(args: list[str], result_file: Path, echo: bool = True) -> str:
    """``inferq bench serve ARGS --result-file RESULT_FILE``; its summary is written to
    RESULT_FILE with the suffix .txt (and printed when ``echo``) and returned."""
    cmd = [sys.executable, "-m", "inferq.cli", "bench", "serve", *args, "--result-file", str(result_file)]
    done = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    result_file.with_suffix(".txt").write_text(done.stdout)
    if echo:
        print(done.stdout, end="", flush=True)
    if done.returncode != 0:
        raise RuntimeError(f"`inferq bench serve` failed ({done.returncode}); see {result_file.with_suffix('.txt')}")
    return done.stdout


def summary_value(summary: str, label: str) -> str:
    """The value on the summary line that starts with ``label`` (e.g. "Median TTFT")."""
    for line in summary.splitlines():
        if line.startswith(label):
            return line.split()[-1]
    return "?"
