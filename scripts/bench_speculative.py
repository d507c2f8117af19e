#!/usr/bin/env python3
"""Speculative decoding benchmark (see gpuworker/bench/speculative.py)."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from inferq.bench.speculative import main  # noqa: E402

sys.exit(main())
