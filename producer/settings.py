"""Connection and admission settings shared by every producer (SDK, gateway,
Celery, CLI). Read from the environment with the INFERQ_ prefix.

The Redis URL may carry credentials and TLS: ``redis://user:pass@host:6379/0``
or ``rediss://...``; INFERQ_REDIS_USERNAME / INFERQ_REDIS_PASSWORD override the
URL's, INFERQ_REDIS_TLS_CA_CERTS etc. configure TLS for ``rediss://``.
"""
from __future__ import annotations

from typing import Any, Optional
from urllib.parse import urlparse

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

from schemas import keys

DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"


class RedisSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="INFERQ_", extra="ignore")

    redis_url: str = DEFAULT_REDIS_URL
    redis_username: Optional[str] = None
    redis_password: Optional[SecretStr] = None
    redis_tls_ca_certs: Optional[str] = None
    redis_tls_certfile: Optional[str] = None
    redis_tls_keyfile: Optional[str] = None
    redis_tls_insecure: bool = Field(False, description="Skip certificate verification (testing only).")
    # Must exceed every XREAD/XREADGROUP BLOCK: redis-py's default of 5 s would
    # turn a long BLOCK into a TimeoutError.
    socket_timeout: float = Field(30.0, gt=1.0)
    socket_connect_timeout: float = Field(5.0, gt=0.0)
    # How long a reply stream reader keeps retrying while Redis is unreachable.
    reconnect_timeout: float = Field(30.0, ge=0.0)

    def client_kwargs(self) -> dict[str, Any]:
        kw: dict[str, Any] = {
            "socket_timeout": self.socket_timeout,
            "socket_connect_timeout": self.socket_connect_timeout,
            "health_check_interval": 30,
        }
        if self.redis_username:
            kw["username"] = self.redis_username
        if self.redis_password is not None:
            kw["password"] = self.redis_password.get_secret_value()
        if urlparse(self.redis_url).scheme == "rediss":
            if self.redis_tls_ca_certs:
                kw["ssl_ca_certs"] = self.redis_tls_ca_certs
            if self.redis_tls_certfile:
                kw["ssl_certfile"] = self.redis_tls_certfile
            if self.redis_tls_keyfile:
                kw["ssl_keyfile"] = self.redis_tls_keyfile
            if self.redis_tls_insecure:
                kw["ssl_cert_reqs"] = "none"
                kw["ssl_check_hostname"] = False
        return kw


class ProducerSettings(RedisSettings):
    default_model: str = keys.DEFAULT_MODEL
    max_backlog: int = Field(10_000, ge=0, description="Jobs per model stream before QueueFull; 0 = unbounded.")
    # How long a job's status hash and reply stream live while the job waits or
    # runs (the worker shortens this to its reply TTL once the job ends).
    reply_ttl: int = Field(86_400, ge=1)
    reply_maxlen: int = Field(20_000, ge=100)
    idempotency_ttl: int = Field(86_400, ge=1)
    # Per-tenant token bucket (jobs per second, burst); 0 disables it.
    rate_limit: float = Field(0.0, ge=0.0)
    rate_burst: int = Field(0, ge=0)
    # A worker whose heartbeat is older than this is treated as gone.
    worker_stale_seconds: float = Field(15.0, gt=0.0)


def sync_client(settings: RedisSettings):
    import redis

    return redis.Redis.from_url(settings.redis_url, **settings.client_kwargs())


def async_client(settings: RedisSettings):
    import redis.asyncio as aredis

    return aredis.Redis.from_url(settings.redis_url, **settings.client_kwargs())
