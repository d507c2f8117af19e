#!/usr/bin/env python3
"""Structured-output throughput benchmark (see gpuworker/bench/structured.py)."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from inferq.bench.structured import main  # noqa: E402

sys.exit(main())
