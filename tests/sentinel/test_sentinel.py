"""Redis Sentinel (INFERQ_REDIS_MODE=sentinel) with real processes: 1 master,
1 replica, 3 sentinels (tests/sentinel/conftest.py).

What is proven here:
- the settings parse (and refuse an incomplete sentinel configuration);
- sync, async and bounded-async clients talk to the master the sentinels name,
  and the same client objects talk to the new master after a failover;
- WAIT after admission (INFERQ_ADMISSION_REPLICAS) returns only once the replica
  has the job, and says so (replicated=False) when fewer replicas acknowledged;
- a paced worker, the sync SDK and the async SDK ride out a SIGKILL of the
  master mid-generation: every job ends with exactly one final event and the
  greedy text of an in-process run, and the worker is still alive.

Replication is asynchronous: a job accepted *without* WAIT in the instant
before the master dies can be lost with it. The jobs this test counts are all
admitted with WAIT 1 (acknowledged by the replica before submit returned), so
they are on the node that becomes master.
"""
from __future__ import annotations

import asyncio
import threading
import time

import httpx
import pytest
import redis

from inferq.producer import AsyncProducer, Producer
from inferq.producer.client import TextFollower
from inferq.producer.errors import QueueUnavailable
from inferq.schemas import SamplingParams, keys
from inferq.schemas.connection import RedisSettings, async_client, sync_client
from inferq.schemas.fold import ReplyFilter
from tests.gateway.stack import running_gateway
from tests.reliability.streams import Watched, watch
from tests.sentinel.conftest import SERVICE, wait_for

MODEL = "tiny"
MAX_TOKENS = 40
PACE_S = "0.1"  # each engine step takes at least this long: a job runs >= MAX_TOKENS * PACE_S


def greedy() -> dict:
    return {"max_tokens": MAX_TOKENS, "temperature": 0.0, "ignore_eos": True}


# -- settings -----------------------------------------------------------------


def test_sentinel_settings_parse_from_env(monkeypatch):
    monkeypatch.setenv("INFERQ_REDIS_MODE", "sentinel")
    monkeypatch.setenv("INFERQ_REDIS_SENTINELS", "10.0.0.1:26379, s2.example:26380,[::1]:26381")
    monkeypatch.setenv("INFERQ_REDIS_SENTINEL_MASTER", "queue")
    monkeypatch.setenv("INFERQ_REDIS_SENTINEL_PASSWORD", "sentinel-secret")
    monkeypatch.setenv("INFERQ_REDIS_URL", "rediss://inferq:data%40pw@queue/2")
    s = RedisSettings()
    assert s.sentinel_mode
    assert s.sentinel_addresses() == [("10.0.0.1", 26379), ("s2.example", 26380), ("::1", 26381)]
    m = s.master_kwargs()
    # The data node's credentials, db and TLS come from the URL; its host does not matter.
    assert (m["username"], m["password"], m["db"], m["ssl"]) == ("inferq", "data@pw", 2, True)
    assert m["socket_timeout"] == s.socket_timeout
    assert s.sentinel_kwargs()["password"] == "sentinel-secret" and "ssl" not in s.sentinel_kwargs()
    assert "data@pw" not in s.safe_url() and "data%40pw" not in s.safe_url() and "sentinel-secret" not in s.safe_url()
    # INFERQ_REDIS_PASSWORD still overrides the URL's, for the master.
    monkeypatch.setenv("INFERQ_REDIS_PASSWORD", "override")
    assert RedisSettings().master_kwargs()["password"] == "override"
    # Standalone stays the default.
    monkeypatch.delenv("INFERQ_REDIS_MODE")
    assert not RedisSettings().sentinel_mode


@pytest.mark.parametrize("env, message", [
    ({"INFERQ_REDIS_SENTINELS": "127.0.0.1:26379"}, "INFERQ_REDIS_SENTINEL_MASTER"),
    ({"INFERQ_REDIS_SENTINEL_MASTER": "m"}, "INFERQ_REDIS_SENTINELS"),
    ({"INFERQ_REDIS_SENTINEL_MASTER": "m", "INFERQ_REDIS_SENTINELS": "127.0.0.1"}, "not host:port"),
    ({"INFERQ_REDIS_MODE": "cluster-ish", "INFERQ_REDIS_SENTINEL_MASTER": "m"}, "redis_mode"),
])
def test_incomplete_sentinel_settings_are_refused(monkeypatch, env, message):
    from pydantic import ValidationError

    monkeypatch.setenv("INFERQ_REDIS_MODE", "sentinel")
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    with pytest.raises(ValidationError, match=message):
        RedisSettings()


def test_worker_takes_sentinel_flags_but_not_the_sentinel_password():
    from inferq.gpuworker.service.cli import parser

    a = parser().parse_args(["--redis-mode", "sentinel", "--redis-sentinels", "h:1", "--redis-sentinel-master", "m"])
    assert (a.redis_mode, a.redis_sentinels, a.redis_sentinel_master) == ("sentinel", "h:1", "m")
    with pytest.raises(SystemExit):
        parser().parse_args(["--redis-sentinel-password", "x"])


# -- clients against a real deployment -------------------------------------------


def _port(info: dict) -> int:
    return int(info["tcp_port"])


def test_clients_follow_the_master_through_a_failover(sentinel_deployment):
    d = sentinel_deployment
    s = d.settings()
    r = sync_client(s)
    first = d.master_port
    assert _port(r.info("server")) == first and r.info("replication")["role"] == "master"
    r.set("inferq:probe", "1")

    async def async_ports():
        a, bounded = async_client(s), async_client(s, max_connections=2)
        try:
            ports = [_port(await a.info("server")), _port(await bounded.info("server"))]
            # The bound holds: 4 concurrent 300 ms BLOCKs on 2 connections queue up
            # (a plain pool past its limit would raise "Too many connections").
            t = time.monotonic()
            await asyncio.gather(*(bounded.xread({"inferq:nothing": "$"}, block=300) for _ in range(4)))
            return ports, time.monotonic() - t
        finally:
            await a.aclose()
            await bounded.aclose()

    ports, waited = asyncio.run(async_ports())
    assert ports == [first, first]
    assert waited >= 0.55  # two rounds of 300 ms, not one

    old = d.kill_master()
    new = d.wait_failover(old)
    assert new != old
    # The same client object finds the new master by itself (reconnect asks the sentinels).
    got = wait_for(lambda: _try(lambda: _port(r.info("server"))), 30, interval=0.1, what="sync client on new master")
    assert got == new and r.get("inferq:probe") == b"1"
    assert r.set("inferq:probe", "2")  # writable: a master, not a read-only replica
    ports, _ = asyncio.run(async_ports())
    assert ports == [new, new]
    r.close()


def _sentinel_clients(d) -> int:
    """inferq's connections to the sentinels, as the sentinels list them."""
    from inferq.schemas.connection import SENTINEL_CLIENT_NAME

    n = 0
    for port in d.sentinel_ports:
        r = d.sentinel(port)
        n += sum(1 for c in r.client_list() if c.get("name") == SENTINEL_CLIENT_NAME)
        r.close()
    return n


def test_closing_a_client_closes_its_sentinel_connections(sentinel_deployment):
    d = sentinel_deployment
    assert _sentinel_clients(d) == 0
    p = Producer(settings=d.settings(admission_replicas=1, default_model=MODEL))
    p.submit("x", sampling=greedy())  # uses a pinned connection for WAIT, which leaves the sentinels alone
    p.redis.ping()
    assert _sentinel_clients(d) >= 1
    p.close()
    wait_for(lambda: _sentinel_clients(d) == 0, 10, what="sync client's sentinel connections closed")

    async def use_and_close():
        for bound in (None, 4):
            r = async_client(d.settings(), max_connections=bound)
            await r.ping()
            assert _sentinel_clients(d) >= 1
            await r.aclose()
            await asyncio.sleep(0)
        ap = AsyncProducer(settings=d.settings(admission_replicas=1, default_model=MODEL))
        await ap.submit("y", sampling=greedy())
        await ap.close()

    asyncio.run(use_and_close())
    wait_for(lambda: _sentinel_clients(d) == 0, 10, what="async clients' sentinel connections closed")


def _try(fn):
    try:
        return fn()
    except (redis.ConnectionError, redis.TimeoutError):
        return None


def test_admission_waits_for_the_replica(sentinel_deployment):
    d = sentinel_deployment
    replica = redis.Redis(port=d.replica_port)
    p = Producer(settings=d.settings(admission_replicas=1, default_model=MODEL))
    h = p.submit("hello", sampling=greedy())
    assert (h.replicas, h.replicated) == (1, True)
    # WAIT returned only after the replica acknowledged: the job is there now.
    assert replica.exists(keys.job_info(h.id)) and replica.exists(keys.reply(h.id))

    # Asking for more replicas than exist: the job is still accepted, and says so.
    p2 = Producer(settings=d.settings(admission_replicas=2, admission_wait_ms=300, default_model=MODEL))
    t = time.monotonic()
    h2 = p2.submit("hello again", sampling=greedy())
    assert time.monotonic() - t >= 0.25  # it did wait for the timeout
    assert (h2.replicas, h2.replicated) == (1, False)
    assert p2.redis.exists(keys.job_info(h2.id))

    # Off by default: no WAIT, nothing claimed.
    h3 = Producer(settings=d.settings(default_model=MODEL)).submit("x", sampling=greedy())
    assert (h3.replicas, h3.replicated) == (None, True)

    async def async_submit():
        ap = AsyncProducer(settings=d.settings(admission_replicas=1, default_model=MODEL))
        try:
            ah = await ap.submit("async hello", sampling=greedy())
            return ah.id, ah.replicas, ah.replicated
        finally:
            await ap.close()

    aid, n, ok = asyncio.run(async_submit())
    assert (n, ok) == (1, True) and replica.exists(keys.job_info(aid))
    replica.close()


def test_jobs_acknowledged_by_wait_survive_a_manual_failover(sentinel_deployment):
    """SENTINEL FAILOVER of a live master: for a moment both nodes accept writes
    (the old master until the sentinels demote it), and what the old one took in
    that moment is discarded. Admission with WAIT tells the two apart: a job whose
    submit said replicated=True is on the new master; one written on the old master
    after the replica stopped following it comes back replicated=False (or its
    submit failed outright). Submits run until one lands on the new master."""
    d = sentinel_deployment
    old = d.master_port
    p = Producer(settings=d.settings(admission_replicas=1, admission_wait_ms=200, default_model=MODEL))
    s0 = d.sentinel(d.sentinel_ports[0])
    assert s0.execute_command("SENTINEL", "FAILOVER", SERVICE)
    s0.close()
    accepted, refused = [], 0
    end = time.monotonic() + 60
    while time.monotonic() < end:
        try:
            accepted.append(p.submit(f"during failover {len(accepted)}", sampling=greedy()))
        except (redis.ConnectionError, redis.TimeoutError, QueueUnavailable):
            refused += 1
            time.sleep(0.02)
            continue
        if _try(lambda: _port(p.redis.info("server"))) not in (None, old):
            break
    new = d.wait_failover(old)
    assert _port(p.redis.info("server")) == new
    r_new = redis.Redis(port=new)
    said_replicated = [h for h in accepted if h.replicated]
    missing = [h.id for h in said_replicated if not r_new.exists(keys.job_info(h.id))]
    assert not missing, f"{len(missing)} jobs said replicated=True but are not on the new master"
    assert said_replicated  # the property was exercised on real submits
    flagged = [h for h in accepted if not h.replicated]
    flagged_lost = sum(1 for h in flagged if not r_new.exists(keys.job_info(h.id)))
    print(f"\n[sentinel] manual failover: {len(accepted)} submits accepted ({len(said_replicated)} replicated, "
          f"{len(flagged)} flagged not replicated, of which {flagged_lost} are gone), {refused} refused; "
          "no replicated job lost")
    r_new.close()
    p.close()


# -- the failover under load ---------------------------------------------------------


def _awatch_all(settings, prompts, submitted: threading.Event, out: dict) -> threading.Thread:
    """The async SDK in its own thread: submit every prompt (WAIT 1), then stream
    them all concurrently, keeping every raw event like tests/reliability/streams.watch."""

    async def one(handle, w: Watched):
        filt, follower = ReplyFilter(), TextFollower(handle.id)
        async for _, ev in handle.stream(timeout=240, raw=True):
            w.raw.append(ev)
            if filt.accept(ev):
                piece = follower.feed(ev)
                if piece:
                    w.text += piece
        w.status = await handle.status()

    async def main():
        ap = AsyncProducer(settings=settings)
        try:
            handles = [await ap.submit(pr, sampling=greedy()) for pr in prompts]
            out["handles"] = handles
            out["watched"] = [Watched(h.id) for h in handles]
            submitted.set()
            results = await asyncio.gather(*(one(h, w) for h, w in zip(handles, out["watched"])),
                                           return_exceptions=True)
            for w, res in zip(out["watched"], results):
                if isinstance(res, BaseException):
                    w.error = res
        finally:
            await ap.close()

    def run():
        try:
            asyncio.run(main())
        except BaseException as e:
            out["error"] = e
            submitted.set()

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def test_worker_and_sdks_ride_out_a_master_kill(sentinel_deployment, tiny_model, offline_llm, start_worker):
    d = sentinel_deployment
    sentinels = ",".join(f"127.0.0.1:{p}" for p in d.sentinel_ports)
    # The URL names the master only for the launcher's readiness check; the worker
    # itself finds the master through the sentinels (that URL is dead after the kill).
    worker = start_worker(f"redis://127.0.0.1:{d.master_port}/0", tiny_model, MODEL, "sentinel-w1",
                          "--redis-mode", "sentinel", "--redis-sentinels", sentinels,
                          "--redis-sentinel-master", SERVICE, "--step-pace-s", PACE_S)
    settings = d.settings(admission_replicas=1, default_model=MODEL)
    observer = sync_client(d.settings())

    sync_prompts = [f"sentinel sync job {i}: " + "lorem ipsum " * i for i in range(3)]
    async_prompts = [f"sentinel async job {i}: " + "dolor sit " * i for i in range(3)]
    gateway_prompt = "sentinel gateway job: amet"
    p = Producer(settings=settings)
    # The gateway in sentinel mode (its async pool bounded), WAIT 1 too.
    with running_gateway("redis://mymaster/0", producer=dict(
            redis_mode="sentinel", redis_sentinels=sentinels, redis_sentinel_master=SERVICE,
            admission_replicas=1, default_model=MODEL)) as gw:
        resp = httpx.post(f"{gw}/v1/jobs", json={"model": MODEL, "prompt": gateway_prompt, "sampling": greedy()},
                          timeout=30)
        assert resp.status_code == 202, resp.text
        assert (resp.json()["replicas"], resp.json()["replicated"]) == (1, True)
        handles = [p.submit(pr, sampling=greedy()) for pr in sync_prompts] + [p.job(resp.json()["id"])]
        _check_failover(d, worker, p, settings, handles, sync_prompts + [gateway_prompt], async_prompts,
                        offline_llm, observer, gw)


def _check_failover(d, worker, p, settings, handles, sync_prompts, async_prompts, offline_llm, observer, gw):
    watched = [watch(h) for h in handles]
    submitted, aout = threading.Event(), {}
    athread = _awatch_all(settings, async_prompts, submitted, aout)
    assert submitted.wait(60) and "error" not in aout, aout.get("error")
    all_handles = handles + aout["handles"]
    # Every counted job was acknowledged by the replica before submit returned
    # (the gateway's said so in its answer; its handle here is p.job(id)).
    assert all(h.replicas == 1 and h.replicated for h in handles[:-1] + aout["handles"])

    def deltas(job_id: str) -> int:
        return sum(1 for _, f in observer.xrange(keys.reply(job_id)) if f[b"type"] == b"delta")

    wait_for(lambda: all(deltas(h.id) > 0 for h in all_handles), 120, what="every job streaming")
    counts = [deltas(h.id) for h in all_handles]
    old = d.kill_master()
    # The kill landed mid-generation: no job had all its tokens.
    assert all(c < MAX_TOKENS for c in counts), counts
    new = d.wait_failover(old)
    assert new != old

    for _, t in watched:
        t.join(240)
    athread.join(240)
    assert "error" not in aout, aout.get("error")
    expected = offline_llm.generate(sync_prompts + async_prompts, SamplingParams(**greedy()))
    r_new = redis.Redis(port=new)
    for w, exp in zip([w for w, _ in watched] + aout["watched"], expected):
        assert w.error is None, (w.job_id, w.error)
        assert w.text == exp.text, w.job_id  # whole, and what a clean greedy run prints
        assert w.count("done") == 1 and w.types[-1] == "done", w.types
        assert w.status["status"] == "done"
        # On the new master: exactly one final event in the job's reply stream.
        finals = [f for _, f in r_new.xrange(keys.reply(w.job_id)) if f[b"type"] in (b"done", b"error")]
        assert len(finals) == 1 and finals[0][b"type"] == b"done", (w.job_id, finals)
    # Finished jobs are acked and deleted on the new master; nothing waits, nothing dead-lettered.
    wait_for(lambda: r_new.xlen(keys.jobs(MODEL)) == 0, 30, what="job stream empty")
    assert r_new.xlen(keys.dlq(MODEL)) == 0
    # The gateway found the new master too: it reports its job done, with the same text.
    gw_job = httpx.get(f"{gw}/v1/jobs/{handles[-1].id}", timeout=30).json()
    assert gw_job["status"] == "done" and gw_job["text"] == expected[len(sync_prompts) - 1].text, gw_job
    assert worker.proc.poll() is None, worker.log()[-3000:]
    # The worker saw the master go (it retried) and carried on.
    assert "redis_unavailable_retrying" in worker.log() or "redis_refusing_writes_retrying" in worker.log()
    print(f"\n[sentinel] master {old} killed mid-run, {new} promoted; {len(all_handles)} jobs (sync SDK, gateway, "
          f"async SDK; WAIT 1) finished once each with the offline text")
    p.close()
    observer.close()
    r_new.close()


# -- operator tools in sentinel mode ------------------------------------------------


def test_doctor_and_up_use_the_sentinel_master(sentinel_deployment, monkeypatch, tmp_path):
    from inferq.doctor import redis_warnings
    from inferq.embedded_redis import EmbeddedRedisError
    from inferq.up import Supervisor, UpOptions

    d = sentinel_deployment
    for k, v in d.env().items():
        monkeypatch.setenv(k, v)
    # doctor reads the master's configuration (these nodes run without AOF: it says so).
    warnings = redis_warnings()
    assert any("appendonly no" in w for w in warnings), warnings
    assert not any("cannot" in w for w in warnings), warnings
    assert not any("INFERQ_ADMISSION_REPLICAS" in w for w in warnings)
    monkeypatch.setenv("INFERQ_ADMISSION_REPLICAS", "2")  # one replica exists
    assert any("1 connected replica" in w for w in redis_warnings())
    monkeypatch.setenv("INFERQ_ADMISSION_REPLICAS", "1")
    assert not any("INFERQ_ADMISSION_REPLICAS" in w for w in redis_warnings())

    # up uses the deployment (its children inherit the INFERQ_REDIS_* settings) and starts no Redis of its own.
    sup = Supervisor(UpOptions(data_dir=str(tmp_path / "up")))
    sup.start_redis()
    assert sup.redis is None and sup._child_env()["INFERQ_REDIS_MODE"] == "sentinel"
    # ... and says so plainly when no sentinel answers, rather than starting a stand-in.
    monkeypatch.setenv("INFERQ_REDIS_SENTINELS", "127.0.0.1:1")
    with pytest.raises(EmbeddedRedisError, match="sentinel"):
        Supervisor(UpOptions(data_dir=str(tmp_path / "up2"))).start_redis()


def test_celery_broker_and_backend_go_through_the_sentinels(sentinel_deployment, monkeypatch):
    pytest.importorskip("celery", reason="the celery extra is not installed")
    from inferq.producer.celery_app import make_celery

    d = sentinel_deployment
    for k, v in d.env().items():
        monkeypatch.setenv(k, v)
    app = make_celery()
    assert app.conf.broker_url.startswith("sentinel://127.0.0.1:") and app.conf.broker_url.count(";") == 2
    assert app.conf.broker_transport_options["master_name"] == SERVICE
    with app.connection_for_write() as c:
        c.ensure_connection(max_retries=3)
        with c.SimpleQueue("inferq-sentinel-probe") as q:
            q.put({"hello": "sentinel"})
            assert q.get(timeout=10).payload == {"hello": "sentinel"}
    app.backend.set("inferq-sentinel-probe", "42")
    r = sync_client(d.settings())
    assert r.get("inferq-sentinel-probe") == b"42"  # written on the master the sentinels name
    r.close()


def test_cli_in_sentinel_mode(sentinel_deployment):
    """`inferq submit` / `inferq status` as a user runs them, configured only by
    the INFERQ_REDIS_* sentinel variables."""
    import os
    import re
    import subprocess
    import sys
    from pathlib import Path

    d = sentinel_deployment
    root = Path(__file__).resolve().parents[2]
    env = {k: v for k, v in os.environ.items() if not k.startswith("INFERQ_")}
    env.update(d.env(), PYTHONPATH=str(root), COLUMNS="200", INFERQ_ADMISSION_REPLICAS="1")

    def inferq(*args):
        return subprocess.run([sys.executable, "-m", "inferq.cli", *args], env=env, capture_output=True, text=True,
                              timeout=120)

    sub = inferq("submit", "--detach", "--model", MODEL, "hello from the cli")
    assert sub.returncode == 0, sub.stderr
    job_id = re.search(r"[0-9a-f]{32}", sub.stdout + sub.stderr).group(0)
    replica = redis.Redis(port=d.replica_port)
    assert replica.exists(keys.job_info(job_id))  # WAIT 1: on the replica before the CLI returned
    replica.close()
    st = inferq("status")
    assert st.returncode == 0, st.stderr
    assert f"sentinel {SERVICE} via" in st.stdout and MODEL in st.stdout, st.stdout
