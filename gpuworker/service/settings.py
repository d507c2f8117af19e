"""Worker configuration: CLI flags over INFERQ_* environment variables over defaults.

The Redis URL may carry a password / ACL user (``redis://user:pass@host/0``)
or TLS (``rediss://``); INFERQ_REDIS_USERNAME / INFERQ_REDIS_PASSWORD and the
INFERQ_REDIS_TLS_* variables override or complete it.
"""
from __future__ import annotations

import os
import socket
from typing import Any, Optional
from urllib.parse import urlparse

from pydantic import Field, SecretStr, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from schemas import keys


class WorkerSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="INFERQ_", extra="ignore")

    # Redis
    redis_url: str = "redis://127.0.0.1:6379/0"
    redis_username: Optional[str] = None
    redis_password: Optional[SecretStr] = None
    redis_tls_ca_certs: Optional[str] = None
    redis_tls_certfile: Optional[str] = None
    redis_tls_keyfile: Optional[str] = None
    redis_tls_insecure: bool = False

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
    lease_seconds: float = Field(10.0, gt=0.0, description="Reaper claims entries idle for 3 leases.")
    max_deliveries: int = Field(5, ge=1, description="Deliveries before a job goes to the DLQ.")
    drain_timeout: float = Field(30.0, ge=0.0)
    reply_ttl: int = Field(3600, ge=1, description="Seconds a reply stream lives after done/error.")
    reply_maxlen: int = Field(20_000, ge=100)
    block_ms: int = Field(1000, ge=10, description="XREADGROUP BLOCK; must stay under the socket timeout.")
    socket_timeout: float = Field(30.0, gt=1.0)
    coalesce_deltas: bool = Field(False, description="Merge a job's deltas within one publish round trip.")
    max_flush_steps: int = Field(8, ge=1, description="Engine steps merged into one pipeline when the publisher lags.")

    check_invariants: bool = Field(False, description="Verify the KV block pool after aborts and when idle (tests, debugging).")
    # Test aid, off by default: tests that need a job to still be running at some
    # point (a deadline, a drain timeout) pace the engine instead of assuming a slow machine.
    step_pace_s: float = Field(0.0, ge=0.0, le=10.0, description="Test aid: sleep this long after every engine step (0 = off).")

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

    def redis_kwargs(self) -> dict[str, Any]:
        kw: dict[str, Any] = {
            "socket_timeout": self.socket_timeout,
            "socket_connect_timeout": 5.0,
            "health_check_interval": 30,
        }
        if self.redis_username:
            kw["username"] = self.redis_username
        if self.redis_password is not None:
            kw["password"] = self.redis_password.get_secret_value()
        if urlparse(self.redis_url).scheme == "rediss":
            for src, dst in (("redis_tls_ca_certs", "ssl_ca_certs"), ("redis_tls_certfile", "ssl_certfile"),
                             ("redis_tls_keyfile", "ssl_keyfile")):
                if getattr(self, src):
                    kw[dst] = getattr(self, src)
            if self.redis_tls_insecure:
                kw["ssl_cert_reqs"] = "none"
                kw["ssl_check_hostname"] = False
        return kw

    def redis(self):
        import redis

        return redis.Redis.from_url(self.redis_url, **self.redis_kwargs())

    def safe_dump(self) -> dict:
        """For logs and the config metric: no secrets, no URL password."""
        d = self.model_dump(exclude={"redis_password"})
        u = urlparse(self.redis_url)
        if u.password:
            d["redis_url"] = self.redis_url.replace(f":{u.password}@", ":***@")
        return d
