"""How every process reaches Redis: the one settings model and client factory.

Used by the SDK, the gateway, Celery, maintenance, the worker and ``inferq up``.
Read from the environment with the INFERQ_ prefix. The URL may carry
credentials and TLS (``redis://user:pass@host:6379/0`` or ``rediss://...``);
INFERQ_REDIS_USERNAME / INFERQ_REDIS_PASSWORD override the URL's, and the
INFERQ_REDIS_TLS_* variables configure TLS for ``rediss://``.
"""
from __future__ import annotations

from typing import Any, Optional
from urllib.parse import quote, urlparse, urlunparse

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"


class RedisSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="INFERQ_", extra="ignore")

    redis_url: str = Field(DEFAULT_REDIS_URL, description="redis:// or rediss:// URL, may carry user:password.")
    redis_username: Optional[str] = Field(None, description="ACL user (overrides the URL's).")
    redis_password: Optional[SecretStr] = Field(None, description="Password (overrides the URL's).")
    redis_tls_ca_certs: Optional[str] = Field(None, description="CA bundle for rediss://.")
    redis_tls_certfile: Optional[str] = Field(None, description="Client certificate for rediss://.")
    redis_tls_keyfile: Optional[str] = Field(None, description="Client key for rediss://.")
    redis_tls_insecure: bool = Field(False, description="Skip certificate verification (testing only).")
    # Must exceed every XREAD/XREADGROUP BLOCK: redis-py's default of 5 s would
    # turn a long BLOCK into a TimeoutError.
    socket_timeout: float = Field(30.0, gt=1.0, description="Redis socket timeout (s); must exceed every BLOCK.")
    socket_connect_timeout: float = Field(5.0, gt=0.0, description="Redis connect timeout (s).")
    reconnect_timeout: float = Field(30.0, ge=0.0, description="How long a reply-stream reader retries while Redis is unreachable (s).")

    @property
    def uses_tls(self) -> bool:
        return urlparse(self.redis_url).scheme == "rediss"

    def tls_files(self) -> dict[str, str]:
        """The TLS file options, under the names redis-py and Celery both use."""
        pairs = (("ssl_ca_certs", self.redis_tls_ca_certs), ("ssl_certfile", self.redis_tls_certfile),
                 ("ssl_keyfile", self.redis_tls_keyfile))
        return {k: v for k, v in pairs if v}

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
        if self.uses_tls:
            kw.update(self.tls_files())
            if self.redis_tls_insecure:
                kw["ssl_cert_reqs"] = "none"
                kw["ssl_check_hostname"] = False
        return kw

    def url_with_credentials(self, url: Optional[str] = None) -> str:
        """The URL with INFERQ_REDIS_USERNAME/PASSWORD put in (for clients such as
        Celery that read only a URL); a URL that has a password is kept."""
        url = url or self.redis_url
        u = urlparse(url)
        if self.redis_password is None or u.password:
            return url
        user = quote(self.redis_username or "", safe="")
        pw = quote(self.redis_password.get_secret_value(), safe="")
        host = u.hostname or "localhost"
        netloc = f"{user}:{pw}@{host}" + (f":{u.port}" if u.port else "")
        return urlunparse(u._replace(netloc=netloc))

    def safe_url(self) -> str:
        return redact_url(self.redis_url)


def redact_url(url: str) -> str:
    """The URL without its password, for logs and messages."""
    u = urlparse(url)
    return url.replace(f":{u.password}@", ":***@") if u.password else url


def sync_client(settings: RedisSettings):
    import redis

    return redis.Redis.from_url(settings.redis_url, **settings.client_kwargs())


def async_client(settings: RedisSettings, max_connections: Optional[int] = None):
    """With ``max_connections``: a bounded pool where a caller waits (up to the
    connect timeout) for a free connection instead of opening one more."""
    import redis.asyncio as aredis

    if max_connections is None:
        return aredis.Redis.from_url(settings.redis_url, **settings.client_kwargs())
    pool = aredis.BlockingConnectionPool.from_url(settings.redis_url, max_connections=max_connections,
                                                   timeout=settings.socket_connect_timeout, **settings.client_kwargs())
    return aredis.Redis(connection_pool=pool)
