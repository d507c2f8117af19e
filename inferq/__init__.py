"""Operator tools: the ``inferq`` command line, ``inferq up``, ``doctor`` and the
benchmark front-ends. They drive both sides (they start workers and talk to the
queue), so they live here rather than in ``producer`` (which a web backend
installs without the GPU side) or ``gpuworker``."""
