#!/usr/bin/env python3
"""The CPU path's scaling model: measured ceilings at 1..N threads and a projection to larger
servers (gpuworker/bench/roofline.py; same as ``inferq bench roofline``).

    python scripts/bench_cpu_roofline.py [--threads 1,2] [--model smollm2-135m|llama-1b|llama-8b|qwen2.5-0.5b]
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from inferq.bench.roofline import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
