"""``python -m gpuworker.service``: run one worker (see cli.py for flags)."""
import sys

from gpuworker.service.cli import main

sys.exit(main())
