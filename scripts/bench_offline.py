#!/usr/bin/env python3
"""Offline throughput benchmark (see gpuworker/bench/offline.py)."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from inferq.bench.offline import main  # noqa: E402

sys.exit(main())
