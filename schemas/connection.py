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
# redis-py's async cluster caps connections per node (default 100) and raises
# past it; without an explicit bound inferq wants what standalone pools give:
# no practical cap.
UNBOUNDED_CONNECTIONS = 2**31


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
    redis_mode: Literal["standalone", "sentinel", "cluster"] = Field(
        "standalone", description="standalone (the URL's server), sentinel (the master the sentinels name) or "
                                  "cluster (INFERQ_REDIS_URL lists seed nodes, comma-separated)")
    redis_sentinels: Optional[str] = Field(None, description="sentinel mode: comma-separated host:port list of the sentinels")
    redis_sentinel_master: Optional[str] = Field(None, description="sentinel mode: the master's service name (sentinel monitor NAME)")
    redis_sentinel_username: Optional[str] = Field(None, description="sentinel mode: ACL user on the sentinels (if they require one)")
    redis_sentinel_password: Optional[SecretStr] = Field(None, description="sentinel mode: password of the sentinels (requirepass in sentinel.conf)")
    redis_sentinel_tls: bool = Field(False, description="sentinel mode: TLS to the sentinels too (same TLS files as the master)")
    # Cluster: the seeds are in INFERQ_REDIS_URL (see the module docstring).
    # redis-py retries at once, each time after reloading the slot map; a
    # failover takes longer than that, so keep this small and let the callers'
    # back-off loops (inferq.schemas.redis_errors.TRANSIENT) wait out the rest.
    redis_cluster_retries: int = Field(3, ge=0, le=100, description="cluster mode: retries inside redis-py after a connection error, CLUSTERDOWN or uncovered slot (each after a slot-map refresh)")

    @model_validator(mode="after")
    def _mode_complete(self):
        if self.redis_mode == "sentinel":
            if not self.redis_sentinel_master:
                raise ValueError("INFERQ_REDIS_MODE=sentinel needs INFERQ_REDIS_SENTINEL_MASTER (the service name)")
            self.sentinel_addresses()  # raises on an empty or malformed list
        if self.redis_mode == "cluster":
            self.cluster_credentials()  # raises on no seed, a malformed seed or seeds that disagree
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

    def cluster_seeds(self) -> list[str]:
        """Cluster mode: INFERQ_REDIS_URL's comma-separated seed URLs, checked
        (redis:// or rediss://, all the same scheme, a host, no db but 0)."""
        seeds = [u.strip() for u in self.redis_url.split(",") if u.strip()]
        if not seeds:
            raise ValueError("INFERQ_REDIS_MODE=cluster needs one or more seed nodes in INFERQ_REDIS_URL "
                             "(redis://host:port,redis://host:port,...)")
        for url in seeds:
            u = urlparse(url)
            if u.scheme not in ("redis", "rediss") or not u.hostname:
                raise ValueError(f"INFERQ_REDIS_URL: cluster seed {redact_url(url)!r} is not redis://host:port "
                                 "or rediss://host:port")
            _ = u.port  # raises ValueError on a malformed port
            db = (u.path or "/").strip("/")
            if db not in ("", "0"):
                raise ValueError(f"INFERQ_REDIS_URL: cluster seed {redact_url(url)!r} names database {db}; "
                                 "a Redis Cluster has only database 0")
        if len({urlparse(url).scheme for url in seeds}) > 1:
            raise ValueError("INFERQ_REDIS_URL: cluster seeds mix redis:// and rediss:// (TLS is all or nothing)")
        return seeds

    def cluster_nodes(self) -> list[tuple[str, int]]:
        """Cluster mode: the seeds as (host, port); 6379 where a seed has no port."""
        return [(urlparse(url).hostname, urlparse(url).port or 6379) for url in self.cluster_seeds()]

    def cluster_credentials(self) -> dict[str, str]:
        """Cluster mode: the seeds' username/password (one set for all nodes:
        the client logs in to nodes it discovers with the same)."""
        creds = {(unquote(u.username or ""), unquote(u.password or ""))
                 for u in map(urlparse, self.cluster_seeds()) if u.username or u.password}
        if len(creds) > 1:
            raise ValueError("INFERQ_REDIS_URL: cluster seeds carry different credentials; a cluster has one set "
                             "(write it on every seed, or on none and set INFERQ_REDIS_USERNAME / PASSWORD)")
        user, pw = creds.pop() if creds else ("", "")
        return {k: v for k, v in (("username", user), ("password", pw)) if v}

    def cluster_kwargs(self) -> dict[str, Any]:
        """Cluster mode: what every node connection takes (credentials from the
        seeds, overridden by INFERQ_REDIS_USERNAME/PASSWORD; TLS; timeouts) and
        the cluster client's retry policy."""
        kw: dict[str, Any] = self.cluster_credentials()
        kw.update(self.client_kwargs())  # INFERQ_REDIS_USERNAME / PASSWORD override the seeds'
        if self.uses_tls:
            kw["ssl"] = True
        kw["retry"] = _cluster_retry(self.redis_cluster_retries)
        return kw

    @property
    def sentinel_mode(self) -> bool:
        return self.redis_mode == "sentinel"

    @property
    def cluster_mode(self) -> bool:
        return self.redis_mode == "cluster"

    @property
    def uses_tls(self) -> bool:
        # In cluster mode the first seed's scheme is every seed's (cluster_seeds checks).
        return urlparse(self.redis_url.strip()).scheme == "rediss"

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
        Celery that read only a URL); a URL that has a password is kept. In
        cluster mode (no ``url`` given): each seed so, comma-joined again."""
        if url is None and self.cluster_mode:
            return ",".join(self.url_with_credentials(seed) for seed in self.cluster_seeds())
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
        if self.cluster_mode:
            # Every seed redacted; split by hand so a malformed list still prints safely.
            return "cluster via " + ",".join(redact_url(u.strip()) for u in self.redis_url.split(",") if u.strip())
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
    try:
        u = urlparse(url)
        pw = u.password
    except ValueError:  # unparseable (e.g. a bracket left open): show nothing that could be a secret
        return "<unparseable URL>"
    return url.replace(f":{pw}@", ":***@") if pw else url


def _cluster_retry(retries: int):
    """The cluster client's retry policy. redis-py (8.x) reads only the count
    from it (its own retries are immediate, after a slot-map refresh); the
    back-off is kept for the versions that honour it."""
    from redis.backoff import ExponentialWithJitterBackoff
    from redis.retry import Retry

    return Retry(ExponentialWithJitterBackoff(base=0.05, cap=1.0), retries)


def _cluster_client(cls, node_cls, settings: RedisSettings, **extra):
    """A RedisCluster (sync or asyncio ``cls``) on the seeds, behaving like the
    standalone client where inferq relies on it (see ``_unreachable_as_cause``)."""
    try:
        r = cls(startup_nodes=[node_cls(host, port) for host, port in settings.cluster_nodes()],
                # Start, and keep serving the healthy shards, while some slots have
                # no master: a command for one of those raises SlotNotCoveredError
                # (retried like a dropped connection) instead of every command
                # failing on a client-side coverage check.
                require_full_coverage=False, **settings.cluster_kwargs(), **extra)
    except Exception as e:  # the sync client reads the slot map in its constructor
        _unreachable_as_cause(e)
        raise
    _translate_unreachable(r.nodes_manager)
    return r


def _unreachable_as_cause(e: Exception) -> None:
    """When no node answers, redis-py raises RedisClusterException("Redis Cluster
    cannot be connected") over the real error. Standalone mode raises that real
    error (ConnectionError, AuthenticationError, TimeoutError), and every retry
    loop and CLI message in inferq knows those: raise it instead."""
    from redis.exceptions import RedisClusterException

    import redis

    if isinstance(e, RedisClusterException) and isinstance(e.__cause__, (redis.ConnectionError, redis.TimeoutError)):
        raise e.__cause__ from None


def _translate_unreachable(nodes_manager) -> None:
    """Apply ``_unreachable_as_cause`` to every later slot-map refresh too: they
    run inside command and pipeline retries, where a whole-cluster restart
    surfaces. The manager's class is swapped for a subclass (the asyncio one has
    __slots__, so its method cannot be replaced on the instance)."""
    nodes_manager.__class__ = _translating_nodes_manager(type(nodes_manager))


def sync_client(settings: RedisSettings):
    import redis

    if settings.sentinel_mode:
        from redis.sentinel import Sentinel

        sentinel = Sentinel(settings.sentinel_addresses(), sentinel_kwargs=settings.sentinel_kwargs())
        return sentinel.master_for(settings.redis_sentinel_master, redis_class=_sync_master_class(),
                                   **settings.master_kwargs())
    if settings.cluster_mode:
        from redis.cluster import ClusterNode

        return _cluster_client(_key_resolving_cluster("sync"), ClusterNode, settings)
    return redis.Redis.from_url(settings.redis_url, **settings.client_kwargs())


def async_client(settings: RedisSettings, max_connections: Optional[int] = None):
    """With ``max_connections``: a bounded pool where a caller waits (up to the
    connect timeout) for a free connection instead of opening one more.

    Cluster mode: the bound is per node, and redis-py's cluster pool does not
    wait: a command past it raises MaxConnectionsError (a ConnectionError, so
    retrying callers treat it as a blip)."""
    import redis.asyncio as aredis

    if settings.sentinel_mode:
        from redis.asyncio.sentinel import Sentinel

        sentinel = Sentinel(settings.sentinel_addresses(), sentinel_kwargs=settings.sentinel_kwargs())
        kw = settings.master_kwargs()
        if max_connections is not None:
            kw.update(connection_pool_class=_bounded_sentinel_pool(), max_connections=max_connections,
                      timeout=settings.socket_connect_timeout)
        return sentinel.master_for(settings.redis_sentinel_master, redis_class=_async_master_class(), **kw)
    if settings.cluster_mode:
        from redis.asyncio.cluster import ClusterNode

        return _cluster_client(_key_resolving_cluster("async"), ClusterNode, settings,
                               max_connections=max_connections or UNBOUNDED_CONNECTIONS)
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


def _key_resolving_cluster(flavour: str) -> type:
    """redis-py's RedisCluster (``flavour`` "sync" or "async") that survives the
    death of the node it asks for the keys of XREAD/XREADGROUP (COMMAND GETKEYS,
    sent to one fixed node before the command is routed, outside redis-py's own
    retries). On a dropped connection there it moves to another master and lets
    the error through; the caller's retry loop then resolves the keys there."""
    key = f"cluster:{flavour}"
    if key not in _classes:
        import redis

        lost = (redis.ConnectionError, redis.TimeoutError)
        if flavour == "sync":
            from redis.cluster import RedisCluster

            class KeyResolvingCluster(RedisCluster):
                def determine_slot(self, *args):
                    try:
                        return super().determine_slot(*args)
                    except lost:
                        self.replace_default_node()
                        raise
        else:
            from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster

            class KeyResolvingCluster(AsyncRedisCluster):
                async def _determine_slot(self, command, *args):
                    try:
                        return await super()._determine_slot(command, *args)
                    except lost:
                        self.replace_default_node()
                        self.commands_parser.node = self.get_default_node()
                        raise

        _classes[key] = KeyResolvingCluster
    return _classes[key]


def _translating_nodes_manager(base: type) -> type:
    """``base`` (redis-py's sync or asyncio NodesManager) whose ``initialize``
    raises the real error when no node answers (``_unreachable_as_cause``)."""
    key = f"nodes:{base.__module__}"
    if key not in _classes:
        import inspect

        if inspect.iscoroutinefunction(base.initialize):
            class TranslatingNodesManager(base):
                __slots__ = ()

                async def initialize(self, *args, **kwargs):
                    try:
                        return await super().initialize(*args, **kwargs)
                    except Exception as e:
                        _unreachable_as_cause(e)
                        raise
        else:
            class TranslatingNodesManager(base):
                __slots__ = ()

                def initialize(self, *args, **kwargs):
                    try:
                        return super().initialize(*args, **kwargs)
                    except Exception as e:
                        _unreachable_as_cause(e)
                        raise

        _classes[key] = TranslatingNodesManager
    return _classes[key]
