"""How every process reaches Redis: the one settings model and client factory.

Used by the SDK, the gateway, Celery, maintenance, the worker and ``inferq up``.
Read from the environment with the INFERQ_ prefix. The URL may carry
credentials and TLS (``redis://user:pass@host:6379/0`` or ``rediss://...``);
INFERQ_REDIS_USERNAME / INFERQ_REDIS_PASSWORD override the URL's, and the
INFERQ_REDIS_TLS_* variables configure TLS for ``rediss://``.

Sentinel (INFERQ_REDIS_MODE=sentinel): INFERQ_REDIS_SENTINELS lists the
sentinels (``host:port,host:port,...``) and INFERQ_REDIS_SENTINEL_MASTER names
the monitored master. INFERQ_REDIS_URL then gives only what the data nodes need:
its scheme (``rediss://`` = TLS to the master), credentials and database number;
its host and port are not used (write the service name there, e.g.
``redis://:pw@mymaster/0``). The clients ask the sentinels for the current
master on every new connection, so after a failover they reconnect to the new one.
"""
from __future__ import annotations

from typing import Any, Literal, Optional
from urllib.parse import quote, unquote, urlparse, urlunparse

from pydantic import Field, SecretStr, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"
# How inferq's connections to the sentinels show in their CLIENT LIST.
SENTINEL_CLIENT_NAME = "inferq-sentinel"


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
    # Sentinel: the master is found through the sentinels (see the module docstring).
    redis_mode: Literal["standalone", "sentinel"] = Field("standalone", description="standalone (the URL's server) or sentinel (the master the sentinels name)")
    redis_sentinels: Optional[str] = Field(None, description="sentinel mode: comma-separated host:port list of the sentinels")
    redis_sentinel_master: Optional[str] = Field(None, description="sentinel mode: the master's service name (sentinel monitor NAME)")
    redis_sentinel_username: Optional[str] = Field(None, description="sentinel mode: ACL user on the sentinels (if they require one)")
    redis_sentinel_password: Optional[SecretStr] = Field(None, description="sentinel mode: password of the sentinels (requirepass in sentinel.conf)")
    redis_sentinel_tls: bool = Field(False, description="sentinel mode: TLS to the sentinels too (same TLS files as the master)")

    @model_validator(mode="after")
    def _sentinel_complete(self):
        if self.redis_mode == "sentinel":
            if not self.redis_sentinel_master:
                raise ValueError("INFERQ_REDIS_MODE=sentinel needs INFERQ_REDIS_SENTINEL_MASTER (the service name)")
            self.sentinel_addresses()  # raises on an empty or malformed list
        return self

    def sentinel_addresses(self) -> list[tuple[str, int]]:
        """INFERQ_REDIS_SENTINELS as (host, port) pairs; [host]:port for IPv6."""
        out = []
        for item in (self.redis_sentinels or "").split(","):
            item = item.strip()
            if not item:
                continue
            host, sep, port = item.rpartition(":")
            if not sep or not host or not port.isdigit():
                raise ValueError(f"INFERQ_REDIS_SENTINELS: {item!r} is not host:port")
            out.append((host.strip("[]"), int(port)))
        if not out:
            raise ValueError("INFERQ_REDIS_MODE=sentinel needs INFERQ_REDIS_SENTINELS (host:port,host:port,...)")
        return out

    @property
    def sentinel_mode(self) -> bool:
        return self.redis_mode == "sentinel"

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
        if self.sentinel_mode:
            return (f"sentinel {self.redis_sentinel_master} via {self.redis_sentinels} "
                    f"({redact_url(self.redis_url)} for credentials/db)")
        return redact_url(self.redis_url)

    def master_kwargs(self) -> dict[str, Any]:
        """Sentinel mode: what the master connections take from the URL
        (credentials, db, TLS) on top of ``client_kwargs``."""
        u = urlparse(self.redis_url)
        kw: dict[str, Any] = {}
        if u.username:
            kw["username"] = unquote(u.username)
        if u.password:
            kw["password"] = unquote(u.password)
        db = (u.path or "/").strip("/")
        kw["db"] = int(db) if db.isdigit() else 0
        kw.update(self.client_kwargs())  # INFERQ_REDIS_USERNAME / PASSWORD override the URL's
        if self.uses_tls:
            kw["ssl"] = True
        return kw

    def sentinel_kwargs(self) -> dict[str, Any]:
        """Connections to the sentinels themselves: their own credentials, the
        same timeouts."""
        kw: dict[str, Any] = {"socket_timeout": self.socket_timeout,
                              "socket_connect_timeout": self.socket_connect_timeout,
                              "client_name": SENTINEL_CLIENT_NAME}
        if self.redis_sentinel_username:
            kw["username"] = self.redis_sentinel_username
        if self.redis_sentinel_password is not None:
            kw["password"] = self.redis_sentinel_password.get_secret_value()
        if self.redis_sentinel_tls:
            kw["ssl"] = True
            kw.update(self.tls_files())
            if self.redis_tls_insecure:
                kw["ssl_cert_reqs"] = "none"
                kw["ssl_check_hostname"] = False
        return kw


def redact_url(url: str) -> str:
    """The URL without its password, for logs and messages."""
    u = urlparse(url)
    return url.replace(f":{u.password}@", ":***@") if u.password else url


def sync_client(settings: RedisSettings):
    import redis

    if settings.sentinel_mode:
        from redis.sentinel import Sentinel

        sentinel = Sentinel(settings.sentinel_addresses(), sentinel_kwargs=settings.sentinel_kwargs())
        return sentinel.master_for(settings.redis_sentinel_master, redis_class=_sync_master_class(),
                                   **settings.master_kwargs())
    return redis.Redis.from_url(settings.redis_url, **settings.client_kwargs())


def async_client(settings: RedisSettings, max_connections: Optional[int] = None):
    """With ``max_connections``: a bounded pool where a caller waits (up to the
    connect timeout) for a free connection instead of opening one more."""
    import redis.asyncio as aredis

    if settings.sentinel_mode:
        from redis.asyncio.sentinel import Sentinel

        sentinel = Sentinel(settings.sentinel_addresses(), sentinel_kwargs=settings.sentinel_kwargs())
        kw = settings.master_kwargs()
        if max_connections is not None:
            kw.update(connection_pool_class=_bounded_sentinel_pool(), max_connections=max_connections,
                      timeout=settings.socket_connect_timeout)
        return sentinel.master_for(settings.redis_sentinel_master, redis_class=_async_master_class(), **kw)
    if max_connections is None:
        return aredis.Redis.from_url(settings.redis_url, **settings.client_kwargs())
    pool = aredis.BlockingConnectionPool.from_url(settings.redis_url, max_connections=max_connections,
                                                   timeout=settings.socket_connect_timeout, **settings.client_kwargs())
    return aredis.Redis(connection_pool=pool)


# The classes below are made on first use: redis is imported lazily here.
_classes: dict[str, Any] = {}


def _sync_master_class():
    """A master client that also closes its connections to the sentinels when it
    is closed (a pinned single-connection client leaves them to its parent)."""
    if "sync" not in _classes:
        import redis

        class SentinelMasterClient(redis.Redis):
            def __init__(self, *args, **kwargs):
                super().__init__(*args, **kwargs)
                self._owns_sentinels = not kwargs.get("single_connection_client", False)

            def close(self) -> None:
                super().close()
                if self._owns_sentinels:
                    for s in self.connection_pool.sentinel_manager.sentinels:
                        s.close()

        _classes["sync"] = SentinelMasterClient
    return _classes["sync"]


def _async_master_class():
    if "async" not in _classes:
        import redis.asyncio as aredis

        class AsyncSentinelMasterClient(aredis.Redis):
            def __init__(self, *args, **kwargs):
                super().__init__(*args, **kwargs)
                self._owns_sentinels = not kwargs.get("single_connection_client", False)

            async def aclose(self, close_connection_pool: Optional[bool] = None) -> None:
                await super().aclose(close_connection_pool)
                if self._owns_sentinels:
                    for s in self.connection_pool.sentinel_manager.sentinels:
                        await s.aclose()

        _classes["async"] = AsyncSentinelMasterClient
    return _classes["async"]


def _bounded_sentinel_pool():
    """A sentinel-managed pool that waits for a free connection (like
    BlockingConnectionPool) instead of opening one past ``max_connections``."""
    if "bounded" not in _classes:
        from redis.asyncio import BlockingConnectionPool
        from redis.asyncio.sentinel import SentinelConnectionPool

        class BoundedSentinelConnectionPool(SentinelConnectionPool, BlockingConnectionPool):
            pass

        _classes["bounded"] = BoundedSentinelConnectionPool
    return _classes["bounded"]
