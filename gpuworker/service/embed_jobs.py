"""Jobs of task ``embed``: the engine request's pooling, and the vector as it
travels in the ``done`` event (base64 of little-endian float32, OpenAI's
``encoding_format: "base64"``: 4 bytes a dimension, about 5.5 KB for 4096)."""
from __future__ import annotations

import base64
from typing import Optional

import numpy as np

from inferq.schemas.job import Job

from inferq.gpuworker.engine.pooling import Pooling


def pooling_of(job: Job) -> Optional[Pooling]:
    """The engine's Pooling for an embed job (kind None: the worker's default); None otherwise."""
    if job.task != "embed":
        return None
    opts = job.embed
    return Pooling() if opts is None else Pooling(kind=opts.pooling, normalize=opts.normalize)


def encode_embedding(vector) -> str:
    return base64.b64encode(np.asarray(vector, dtype="<f4").tobytes()).decode("ascii")
