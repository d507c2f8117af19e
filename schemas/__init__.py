"""The wire contract shared by producers and workers (pydantic v2, no torch).

Everything that crosses Redis or HTTP is defined here, so both sides validate
the same way.
"""
from schemas.sampling import SamplingParams
from schemas.structured import StructuredOutputs
from schemas.job import ChatMessage, Job
from schemas.events import (
    DeltaEvent,
    DoneEvent,
    ErrorEvent,
    QueuedEvent,
    ReplyEvent,
    RestartedEvent,
    StartedEvent,
    Timings,
    Usage,
    decode_event,
    encode_event,
)
from schemas import keys

__all__ = [
    "SamplingParams",
    "StructuredOutputs",
    "ChatMessage",
    "Job",
    "ReplyEvent",
    "QueuedEvent",
    "StartedEvent",
    "DeltaEvent",
    "RestartedEvent",
    "DoneEvent",
    "ErrorEvent",
    "Usage",
    "Timings",
    "encode_event",
    "decode_event",
    "keys",
]
