"""Worker configuration: CLI flags over INFERQ_* environment variables over defaults.

The Redis URL may carry a password / ACL user (``redis://user:pass@host/0``)
or TLS (``rediss://``); INFERQ_REDIS_USERNAME / INFERQ_REDIS_PASSWORD and the
INFERQ_REDIS_TLS_* variables override or complete it.
"""
from __future__ import annotations

import os
import socket
from typing import Optional

from pydantic import Field, model_validator
from pydantic_settings import SettingsConfigDict

from schemas import keys
from schemas.connection import sync_client
from schemas.policy import QueuePolicy


class WorkerSettings(QueuePolicy):
    model_config = SettingsConfigDict(env_prefix="INFERQ_", extra="ignore")

    # Model and engine
    model: str = Field("", description="HF folder or .gguf file; empty = bundled SmolLM2-135M-Instruct.")
    served_model_name: Optional[str] = Field(None, description="Queue name of the model; default: keys.DEFAULT_MODEL for the bundled model, else the folder/file name.")
    attention_backend: Optional[str] = None
    max_num_seqs: int = Field(64, ge=1)
    max_num_batched_tokens: int = Field(2048, ge=1)
    num_kv_blocks: Optional[int] = Field(None, ge=1)
    block_size: int = 16
    max_model_len: Optional[int] = Field(None, ge=2)
    device: Optional[str] = None
    dtype: Optional[str] = None

    # Queue behaviour
    worker_id: str = Field(default_factory=lambda: f"{socket.gethostname()}-{os.getpid()}")
    drain_timeout: float = Field(30.0, ge=0.0)
    block_ms: int = Field(1000, ge=10, description="XREADGROUP BLOCK; must stay under the socket timeout.")
    coalesce_deltas: bool = Field(False, description="Merge a job's deltas within one publish round trip.")
    max_flush_steps: int = Field(8, ge=1, description="Engine steps merged into one pipeline when the publisher lags.")

    check_invariants: bool = Field(False, description="Verify the KV block pool after aborts and when idle (tests, debugging).")

    # Observability
    metrics_port: int = Field(0, ge=0, le=65535, description="0 = no metrics server.")
    metrics_addr: str = "0.0.0.0"
    log_level: str = "info"
    log_json: bool = True
    log_prompts: bool = False

    @model_validator(mode="after")
    def _block_below_socket_timeout(self):
        if self.block_ms / 1000 >= self.socket_timeout - 1:
            raise ValueError(f"block_ms ({self.block_ms}) must stay at least 1 s under socket_timeout ({self.socket_timeout}s)")
        return self

    @property
    def model_name(self) -> str:
        if self.served_model_name:
            return self.served_model_name
        if not self.model:
            return keys.DEFAULT_MODEL
        base = os.path.basename(os.path.normpath(self.model))
        return base[:-5] if base.endswith(".gguf") else base

    @property
    def consumer_name(self) -> str:
        # Stable across restarts when worker_id is given, so a restarted worker
        # re-reads its own pending entries first.
        return self.worker_id

    def redis(self):
        return sync_client(self)

    def safe_dump(self) -> dict:
        """For logs and the config metric: no secrets, no URL password."""
        return {**self.model_dump(exclude={"redis_password"}), "redis_url": self.safe_url()}
