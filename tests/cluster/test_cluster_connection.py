"""Redis Cluster (INFERQ_REDIS_MODE=cluster) in the connection layer, against a
real 3-master / 3-replica cluster (tests/redis_cluster.py).

What is proven here:
- the settings parse seed lists, refuse a cluster configuration that cannot
  work (no seed, a db number, mixed TLS, seeds that disagree on credentials),
  and never print a seed's password;
- sync and async clients reach every shard, run 2-key scripts whose keys share
  a hash tag, and a worker ``Batch`` of scripts on several slots is sent in
  one round and answers each script;
- a cross-slot script is a bug: raised at once, never retried;
- after SIGKILL of the master serving a key, the same client keeps working:
  ``Batch.send`` and ``retrying`` wait out the failover by themselves;
- no node reachable, or wrong credentials, raise what standalone mode raises
  (ConnectionError / AuthenticationError), not redis-py's cluster wrapper.
"""
from __future__ import annotations

import asyncio
import time

import pytest
import redis
from pydantic import ValidationError
from redis.crc import key_slot

from inferq.gpuworker.service.batch import Batch, retrying
from inferq.schemas.connection import RedisSettings, async_client, sync_client
from inferq.schemas.redis_errors import TRANSIENT, is_cluster_client
from tests.redis_cluster import RedisClusterDeployment

# Both keys of a script share the hash tag, so they share a slot.
TWO_KEYS = "redis.call('SET', KEYS[1], ARGV[1]); redis.call('SET', KEYS[2], ARGV[2]); " \
           "return {redis.call('GET', KEYS[1]), redis.call('GET', KEYS[2])}"
INCR = "return redis.call('INCR', KEYS[1])"


def cluster_settings(c: RedisClusterDeployment, **over) -> RedisSettings:
    return RedisSettings(redis_mode="cluster", redis_url=c.url, **over)


def keys_on_distinct_masters(c: RedisClusterDeployment, n: int = 3) -> list[str]:
    """Hash tags {p0}, {p1}, ... picked so that each lands on another master."""
    out, masters = [], set()
    for i in range(1000):
        tag = f"{{p{i}}}"
        m = c.master_of_slot(key_slot(tag.encode()))
        if m not in masters:
            masters.add(m)
            out.append(tag)
        if len(out) == n:
            return out
    raise AssertionError("could not find keys on distinct masters")


class Log:
    """Collects what Batch.send / retrying warn about."""

    def __init__(self):
        self.events: list[str] = []

    def warning(self, event, **kw):
        self.events.append(event)


# -- settings (no cluster needed) ------------------------------------------------


def test_cluster_settings_parse_from_env(monkeypatch):
    monkeypatch.setenv("INFERQ_REDIS_MODE", "cluster")
    monkeypatch.setenv("INFERQ_REDIS_URL", "redis://:s3cret@10.0.0.1:7000, redis://:s3cret@node2.example:7001,"
                                           "redis://:s3cret@[::1]")
    s = RedisSettings()
    assert s.cluster_mode and not s.sentinel_mode and not s.uses_tls
    assert s.cluster_nodes() == [("10.0.0.1", 7000), ("node2.example", 7001), ("::1", 6379)]
    kw = s.cluster_kwargs()
    assert kw["password"] == "s3cret" and "ssl" not in kw and "db" not in kw
    assert kw["retry"].get_retries() == s.redis_cluster_retries


def test_cluster_credentials_and_tls_as_in_standalone(monkeypatch):
    s = RedisSettings(redis_mode="cluster", redis_url="rediss://h1:7000,rediss://h2:7001",
                      redis_username="inferq", redis_password="from-env", redis_tls_insecure=True)
    kw = s.cluster_kwargs()
    assert (kw["username"], kw["password"], kw["ssl"], kw["ssl_cert_reqs"]) == ("inferq", "from-env", True, "none")
    # Celery-style URLs get the password put into every seed.
    assert s.url_with_credentials() == "rediss://inferq:from-env@h1:7000,rediss://inferq:from-env@h2:7001"
    # INFERQ_REDIS_PASSWORD overrides the seeds' password.
    s = RedisSettings(redis_mode="cluster", redis_url="redis://:url-pw@h1:7000", redis_password="env-pw")
    assert s.cluster_kwargs()["password"] == "env-pw"


def test_safe_url_redacts_every_seed():
    s = RedisSettings(redis_mode="cluster",
                      redis_url="redis://admin:s3cret@h1:7000,redis://admin:s3cret@h2:7001,redis://h3:7002")
    shown = s.safe_url()
    assert "s3cret" not in shown
    assert shown.count(":***@") == 2 and "h1:7000" in shown and "h2:7001" in shown and "h3:7002" in shown


@pytest.mark.parametrize("url, message", [
    ("", "needs one or more seed nodes"),
    (" , ,", "needs one or more seed nodes"),
    ("h1:7000", "is not redis://host:port"),
    ("http://h1:7000", "is not redis://host:port"),
    ("redis://h1:7000/3", "only database 0"),
    ("redis://h1:7000,rediss://h2:7001", "mix redis:// and rediss://"),
    ("redis://:a@h1:7000,redis://:b@h2:7001", "different credentials"),
    ("redis://h1:notaport", "Port could not be cast"),
])
def test_bad_cluster_config_is_a_clear_value_error(url, message):
    with pytest.raises(ValueError, match=message) as e:  # pydantic's ValidationError is a ValueError
        RedisSettings(redis_mode="cluster", redis_url=url)
    assert isinstance(e.value, ValidationError)
    assert ":a@" not in str(e.value) and ":b@" not in str(e.value)  # no password in the message


def test_celery_needs_its_own_broker_in_cluster_mode(monkeypatch):
    pytest.importorskip("celery", reason="the celery extra is not installed")
    from inferq.producer.celery_app import CelerySettings, broker_url

    monkeypatch.setenv("INFERQ_REDIS_MODE", "cluster")
    monkeypatch.setenv("INFERQ_REDIS_URL", "redis://h1:7000,redis://h2:7001")
    with pytest.raises(ValueError, match="INFERQ_CELERY_BROKER_URL"):
        broker_url(CelerySettings())
    monkeypatch.setenv("INFERQ_CELERY_BROKER_URL", "redis://broker:6379/0")
    assert broker_url(CelerySettings()) == "redis://broker:6379/0"


# -- clients against a real cluster ---------------------------------------------------


def test_sync_client_reaches_every_shard(redis_cluster):
    c = redis_cluster
    r = sync_client(cluster_settings(c))
    try:
        assert is_cluster_client(r)
        tags = keys_on_distinct_masters(c)
        for i, tag in enumerate(tags):
            r.set(f"{tag}plain", i)
        assert [int(r.get(f"{tag}plain")) for tag in tags] == [0, 1, 2]
        # A 2-key script: both keys carry the tag, so both live in one slot.
        assert r.eval(TWO_KEYS, 2, f"{tags[0]}a", f"{tags[0]}b", "x", "y") == [b"x", b"y"]
    finally:
        r.close()


def test_async_client_reaches_every_shard(redis_cluster):
    c = redis_cluster
    tags = keys_on_distinct_masters(c)

    async def go():
        r = async_client(cluster_settings(c), max_connections=8)
        try:
            assert is_cluster_client(r)
            for i, tag in enumerate(tags):
                await r.set(f"{tag}async", i)
            got = [int(await r.get(f"{tag}async")) for tag in tags]
            both = await r.eval(TWO_KEYS, 2, f"{tags[1]}a", f"{tags[1]}b", "p", "q")
            script = r.register_script(TWO_KEYS)  # EVALSHA, loaded on the key's node when missing
            again = await script(keys=[f"{tags[2]}a", f"{tags[2]}b"], args=["m", "n"])
            return got, both, again
        finally:
            await r.aclose()

    got, both, again = asyncio.run(go())
    assert got == [0, 1, 2] and both == [b"p", b"q"] and again == [b"m", b"n"]


def test_batch_of_scripts_on_several_slots(redis_cluster):
    c = redis_cluster
    r = sync_client(cluster_settings(c))
    try:
        tags = keys_on_distinct_masters(c)
        b = Batch()
        idx = [b.eval(TWO_KEYS, 2, f"{tag}x", f"{tag}y", f"x{i}", f"y{i}") for i, tag in enumerate(tags)]
        xadd = b.xadd(f"{tags[0]}stream", {"f": "1"})
        hset = b.hset(f"{tags[1]}hash", mapping={"a": "1"})
        # transaction=True (the default) is ignored on a cluster: the commands span nodes.
        res = b.send(r, give_up=lambda: True)
        assert [res[i] for i in idx] == [[f"x{i}".encode(), f"y{i}".encode()] for i in range(len(tags))]
        assert isinstance(res[xadd], bytes) and res[hset] == 1
        # Each script ran atomically on the master of its slot.
        assert [r.get(f"{tag}y") for tag in tags] == [f"y{i}".encode() for i in range(len(tags))]
    finally:
        r.close()


def test_a_cross_slot_script_is_a_bug_not_an_outage(redis_cluster):
    """Keys without a shared tag may land on two slots: raised at once (not in
    TRANSIENT), so a wrong key layout cannot hide behind retries."""
    r = sync_client(cluster_settings(redis_cluster))
    try:
        assert key_slot(b"job:a") != key_slot(b"job:b")
        b = Batch()
        b.eval(TWO_KEYS, 2, "job:a", "job:b", "1", "2")
        t0 = time.monotonic()
        with pytest.raises(redis.exceptions.RedisClusterException, match="same key slot") as e:
            b.send(r, give_up=lambda: False)  # would loop forever if it counted as transient
        assert not isinstance(e.value, TRANSIENT) and time.monotonic() - t0 < 5
    finally:
        r.close()


def test_password_cluster_and_wrong_credentials(password_redis_cluster):
    c = password_redis_cluster
    r = sync_client(cluster_settings(c))
    try:
        assert r.set("{p0}auth", 1) and r.get("{p0}auth") == b"1"
    finally:
        r.close()
    seeds_without_pw = ",".join(u.replace(f":{c.password}@", "") for u in c.seed_urls())
    with pytest.raises(redis.AuthenticationError):
        sync_client(RedisSettings(redis_mode="cluster", redis_url=seeds_without_pw, redis_password="wrong"))
    shown = cluster_settings(c).safe_url()
    assert c.password not in shown and shown.count(":***@") == 2


def test_no_reachable_seed_is_a_connection_error(tmp_path):
    """As in standalone mode: inferq's retry loops and CLI messages handle it."""
    from tests.conftest import free_port

    s = RedisSettings(redis_mode="cluster", redis_url=f"redis://127.0.0.1:{free_port()}", socket_connect_timeout=1)
    with pytest.raises(redis.ConnectionError):
        sync_client(s)

    async def first_command():
        r = async_client(s)
        try:
            await r.ping()
        finally:
            await r.aclose()

    with pytest.raises(redis.ConnectionError):
        asyncio.run(first_command())


def test_up_uses_the_cluster_and_doctor_does_not_crash(redis_cluster, monkeypatch, tmp_path):
    """`inferq up` takes the operator's cluster (never an embedded stand-in);
    doctor reads one node's configuration without failing."""
    from inferq.doctor import redis_warnings
    from inferq.embedded_redis import EmbeddedRedisError
    from inferq.up import Supervisor, UpOptions

    for k, v in redis_cluster.env().items():
        monkeypatch.setenv(k, v)
    assert not any("cannot reach" in w for w in redis_warnings())
    sup = Supervisor(UpOptions(data_dir=str(tmp_path / "up")))
    sup.start_redis()
    env = sup._child_env()
    assert sup.redis is None and env["INFERQ_REDIS_MODE"] == "cluster" and env["INFERQ_REDIS_URL"] == redis_cluster.url
    from tests.conftest import free_port

    monkeypatch.setenv("INFERQ_REDIS_URL", f"redis://127.0.0.1:{free_port()}")
    with pytest.raises(EmbeddedRedisError, match="INFERQ_REDIS_MODE=cluster"):
        Supervisor(UpOptions(data_dir=str(tmp_path / "up2"))).start_redis()


# -- failover ---------------------------------------------------------------------------


def test_same_client_keeps_working_through_a_failover(disposable_redis_cluster):
    """SIGKILL the master of a key's slot, then write at once (before any
    replica is promoted): Batch.send and retrying wait the failover out with
    back-off, on the same client objects, with nothing done by the caller. An
    async client made before the kill works after the failover too."""
    c = disposable_redis_cluster
    s = cluster_settings(c)
    tag = "{p0}"
    slot = key_slot(tag.encode())
    other_tag = next(t for t in keys_on_distinct_masters(c)
                     if c.master_of_slot(key_slot(t.encode())) != c.master_of_slot(slot))
    deadline = time.monotonic() + 60

    def give_up() -> bool:
        return time.monotonic() > deadline

    async def scenario():
        r, ar = sync_client(s), async_client(s, max_connections=4)
        try:
            r.set(f"{tag}counter", 100)
            await ar.set(f"{tag}async", "before")  # the async client has its slot map and connections
            old = c.kill_master_of_slot(slot)

            log = Log()
            b = Batch()
            i = b.eval(INCR, 1, f"{tag}counter")
            j = b.eval(INCR, 1, f"{other_tag}counter")  # a healthy shard in the same round
            res = b.send(r, give_up=give_up, log=log)
            assert not any(isinstance(x, Exception) for x in res), res
            # The replica may not have had the last write (replication is async): >= 1.
            assert res[j] == 1 and res[i] >= 1
            assert "redis_unavailable_retrying" in log.events  # it really waited the failover out

            new = c.wait_failover(slot)
            assert new != old
            assert retrying(lambda: r.set(f"{tag}after", "ok"), give_up=give_up, log=log, what="set") is True
            assert r.get(f"{tag}after") == b"ok"

            await ar.set(f"{tag}async", "after")  # the same async client, on the promoted replica
            assert await ar.get(f"{tag}async") == b"after"
        finally:
            r.close()
            await ar.aclose()

    asyncio.run(scenario())


@pytest.mark.parametrize("error", [redis.ConnectionError("down"), redis.exceptions.ClusterDownError("CLUSTERDOWN"),
                                   redis.exceptions.TryAgainError("TRYAGAIN"),
                                   redis.exceptions.SlotNotCoveredError("slot 7 not covered")])
def test_gateway_answers_503_for_a_cluster_between_topologies(error):
    """A failover seen by a request is 'retry shortly', as a dropped connection is."""
    from fastapi import FastAPI
    from fastapi.testclient import TestClient

    from inferq.producer.gateway.errors import install_error_handlers

    app = FastAPI()
    install_error_handlers(app)

    @app.get("/boom")
    async def boom():
        raise error

    resp = TestClient(app, raise_server_exceptions=False).get("/boom")
    assert resp.status_code == 503 and resp.json()["error"]["code"] == "redis_unavailable"


def test_batch_resends_when_a_cluster_pipeline_returns_an_outage_in_place():
    """redis-py's cluster pipeline (raise_on_error=False) puts a ConnectionError
    in a command's place when that node stays unreachable through its own
    retries; Batch.send treats that like a raised outage: back off, re-send."""

    class Pipe:
        def __init__(self, answers):
            self.answers = answers

        def eval(self, *args):
            pass

        def execute(self, raise_on_error=True):
            return self.answers.pop(0)

    answers = [[1, redis.ConnectionError("node lost")], [1, redis.exceptions.ClusterDownError("CLUSTERDOWN")], [1, 2]]

    class Client:
        def pipeline(self, transaction=True):
            return Pipe(answers)

    b = Batch()
    b.eval("return 1", 0)
    b.eval("return 2", 0)
    log = Log()
    assert b.send(Client(), give_up=lambda: False, log=log) == [1, 2]
    assert log.events == ["redis_unavailable_retrying"] * 2
    # Once give_up says stop, the answers are returned as they are (errors in place).
    answers[:] = [[1, redis.ConnectionError("node lost")]]
    res = b.send(Client(), give_up=lambda: True)
    assert isinstance(res[1], redis.ConnectionError)


def _slot_owned_by(r, node) -> int:
    return next(slot for slot, nodes in r.nodes_manager.slots_cache.items() if nodes and nodes[0] == node)


def test_stream_reads_survive_the_loss_of_the_node_that_resolves_their_keys(disposable_redis_cluster):
    """redis-py asks one fixed node (the default node) for the keys of XREAD and
    XREADGROUP before routing them. Kill exactly that node (the same one for the
    sync and the async client): reads of a stream on another master keep working
    after a retry."""
    c = disposable_redis_cluster
    r = sync_client(cluster_settings(c))
    default = r.get_default_node()
    victim_slot = _slot_owned_by(r, default)
    victim = c.master_of_slot(victim_slot)
    stream = next(f"inferq:resolve:{{{i}}}" for i in range(10_000)
                  if c.master_of_slot(key_slot(f"{{{i}}}".encode())) != victim)
    r.xadd(stream, {"a": "1"})
    r.xgroup_create(stream, "g", id="0")

    async def scenario():
        ar = async_client(cluster_settings(c))
        await ar.initialize()
        same = next(n for n in ar.get_nodes() if (n.host, n.port) == (default.host, default.port))
        ar.replace_default_node(same)
        ar.commands_parser.node = same
        assert await ar.xread({stream: "0"}, count=1)
        c.kill_master_of_slot(victim_slot)
        c.wait_failover(victim_slot)
        end = time.time() + 60
        got = retrying(lambda: r.xread({stream: "0"}, count=1), give_up=lambda: time.time() > end)
        assert got and got[0][1][0][1] == {b"a": b"1"}
        got = retrying(lambda: r.xreadgroup("g", "c", {stream: ">"}, count=1), give_up=lambda: time.time() > end)
        assert got and got[0][1][0][1] == {b"a": b"1"}
        try:
            for _ in range(20):
                try:
                    got = await ar.xread({stream: "0"}, count=1)
                    break
                except TRANSIENT:
                    await asyncio.sleep(0.2)
            else:
                raise AssertionError("the async client never read the stream again")
            assert got and got[0][1][0][1] == {b"a": b"1"}
        finally:
            await ar.aclose()

    asyncio.run(scenario())
    r.close()
