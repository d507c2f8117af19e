"""The wire contract shared by producers and workers (pydantic v2, no torch).

Everything that crosses Redis or HTTP is defined here, so both sides validate
the same way.
"""
from inferq.schemas.sampling import SamplingParams
from inferq.schemas.structured import StructuredOutputs
from inferq.schemas.job import ChatMessage, Job
from inferq.schemas.events import (
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
from inferq.schemas import keys

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
