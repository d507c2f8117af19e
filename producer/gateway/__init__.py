"""OpenAI-compatible HTTP gateway and native jobs API (FastAPI). A producer:
it admits jobs to Redis and reads their reply streams; it never loads a model."""
from inferq.producer.gateway.app import create_app, serve

__all__ = ["create_app", "serve"]
