"""Fixtures that start a real Redis Cluster (tests/redis_cluster.py)."""
from __future__ import annotations

import os

import pytest

from tests.redis_cluster import RedisClusterDeployment, cluster_support


def _start(tmp_path_factory, name: str, **kw) -> RedisClusterDeployment:
    why = cluster_support()
    if why:
        if os.environ.get("CI"):  # CI has Redis 7 and redis-cli: never lose these tests silently there
            pytest.fail(f"the Redis Cluster tests cannot run: {why}")
        pytest.skip(why)
    return RedisClusterDeployment(tmp_path_factory.mktemp(name), **kw).start()


@pytest.fixture(scope="module")
def redis_cluster(tmp_path_factory):
    """3 masters + 3 replicas shared by a module's tests; tests must not break it
    (use ``disposable_redis_cluster`` to kill nodes)."""
    c = _start(tmp_path_factory, "cluster")
    yield c
    c.stop()


@pytest.fixture
def disposable_redis_cluster(tmp_path_factory):
    """A cluster of its own for a test that kills nodes."""
    c = _start(tmp_path_factory, "cluster-faults")
    yield c
    c.stop()


@pytest.fixture(scope="module")
def password_redis_cluster(tmp_path_factory):
    """The same topology with requirepass + masterauth on every node."""
    c = _start(tmp_path_factory, "cluster-auth", password="cluster-secret")
    yield c
    c.stop()
