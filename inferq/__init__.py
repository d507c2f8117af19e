"""inferq: a queue-driven LLM generation service.

One import root for everything::

    from inferq import Producer, AsyncProducer, SamplingParams   # the SDK: Redis + pydantic, no torch
    from inferq import LLM                                       # the engine in-process (loads torch)

Subpackages keep the design's layers: ``inferq.schemas`` (the wire contract),
``inferq.producer`` (SDK, gateway, Celery), ``inferq.gpuworker`` (engine and worker
service), ``inferq.kernels`` (Triton and C kernels). The modules directly under
``inferq`` are the operator tools (the CLI, ``up``, ``doctor``) and ``inferq.bench``.

The public names load on first use, so ``import inferq.kernels`` or ``import
inferq.schemas`` loads only that layer.
"""
import importlib

__version__ = "0.1.0"

_PUBLIC = {
    "inferq.producer": ("Producer", "AsyncProducer", "JobHandle", "AsyncJobHandle", "JobResult",
                        "ProducerSettings", "RedisSettings", "InferqError", "QueueFull",
                        "QueueUnavailable", "RateLimited", "JobFailed", "JobNotFound", "JobRestarted"),
    "inferq.schemas": ("SamplingParams", "StructuredOutputs", "ChatMessage"),
    "inferq.gpuworker": ("LLM", "EngineConfig"),
}
_HOME = {name: module for module, names in _PUBLIC.items() for name in names}

__all__ = sorted(_HOME)


def __getattr__(name):
    module = _HOME.get(name)
    if module is None:
        raise AttributeError(f"module 'inferq' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_HOME))
