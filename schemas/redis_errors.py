"""Which Redis errors pass by themselves: the one home for the tuples every
retry loop (worker, producer, followers) catches, standalone, Sentinel or Cluster.

- ``UNAVAILABLE``: Redis cannot be reached or is between topologies (a dropped
  connection, a timeout, a cluster that lost a master and has not promoted a
  replica yet, a slot being moved). A retry after a pause reaches the node that
  serves the key now: redis-py's cluster client reloads its slot map on these.
- ``REFUSING_WRITES``: Redis answers but will not write (out of memory under
  noeviction; a replica, e.g. just after a failover). Passes once an operator,
  a TTL or a promotion frees the way.
- ``TRANSIENT``: both; what a writer waits out with back-off.

Not here, on purpose: cross-slot errors (``ClusterCrossSlotError``, the
client-side "all keys must map to the same key slot") and a misconfigured
cluster. Those are bugs or setup mistakes; retrying would hide them.
"""
from __future__ import annotations

import redis
from redis import exceptions as rx

REFUSING_WRITES = (rx.OutOfMemoryError, rx.ReadOnlyError)

# ConnectionError covers MaxConnectionsError (async cluster pool full) and
# BusyLoadingError (a restarted node still loading). ClusterError covers
# ClusterDownError / MasterDownError (CLUSTERDOWN, MASTERDOWN) and "TTL
# exhausted" (too many MOVED/ASK hops while slots move).
CLUSTER_UNAVAILABLE = (rx.ClusterError, rx.TryAgainError, rx.MovedError, rx.AskError, rx.SlotNotCoveredError)
UNAVAILABLE = (redis.ConnectionError, redis.TimeoutError, *CLUSTER_UNAVAILABLE)
TRANSIENT = (*UNAVAILABLE, *REFUSING_WRITES)


def is_cluster_client(r) -> bool:
    """True for redis-py's RedisCluster (sync or asyncio) and its pipelines."""
    from redis.asyncio.cluster import ClusterPipeline as AsyncClusterPipeline, RedisCluster as AsyncRedisCluster
    from redis.cluster import ClusterPipeline, RedisCluster

    return isinstance(r, (RedisCluster, AsyncRedisCluster, ClusterPipeline, AsyncClusterPipeline))
