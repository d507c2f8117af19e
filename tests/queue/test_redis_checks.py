"""The worker and `inferq doctor` say in plain words when Redis is set up in a
way that loses jobs: eviction, no memory limit, no persistence."""
import redis

from inferq.schemas.redis_checks import queue_warnings
from tests.conftest import RedisServer


def test_a_queue_ready_redis_gets_no_warning(redis_server):
    r = redis.Redis.from_url(redis_server.url)
    r.config_set("maxmemory", "512mb")
    r.config_set("appendonly", "yes")
    try:
        assert queue_warnings(r) == []
    finally:
        r.config_set("maxmemory", "0")
        r.config_set("appendonly", "no")
        r.close()


def test_eviction_no_limit_and_no_persistence_are_named(tmp_path):
    server = RedisServer(tmp_path).start()  # appendonly no, no maxmemory
    r = redis.Redis.from_url(server.url)
    try:
        r.config_set("maxmemory-policy", "allkeys-lru")
        text = " | ".join(queue_warnings(r))
        assert "maxmemory-policy allkeys-lru" in text and "noeviction" in text
        assert "no maxmemory limit" in text
        assert "appendonly yes" in text
    finally:
        r.close()
        server.stop()


def test_a_user_without_info_gets_a_hint_not_a_crash(tmp_path):
    server = RedisServer(tmp_path).start()
    admin = redis.Redis.from_url(server.url)
    admin.execute_command("ACL", "SETUSER", "limited", "on", ">pw", "~inferq:*", "+@all", "-@dangerous")
    r = redis.Redis(port=server.port, username="limited", password="pw")
    try:
        (only,) = queue_warnings(r)
        assert "cannot read Redis INFO" in only and "noeviction" in only
    finally:
        r.close()
        admin.close()
        server.stop()
