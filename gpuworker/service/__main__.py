"""``python -m inferq.gpuworker.service``: run one worker (see cli.py for flags)."""
import sys

from inferq.gpuworker.service.cli import main

sys.exit(main())
