"""Celery beside a Redis Cluster: kombu's Redis transport cannot use a cluster,
so Celery's broker and result backend are a standalone Redis of their own
(INFERQ_CELERY_BROKER_URL) while the jobs live on the cluster. A real `celery
worker` process runs the generate task against a real inferq worker."""
from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from producer import Producer
from schemas import keys
from schemas.connection import RedisSettings, sync_client
from tests.cli.procs import LineReader, env_without
from tests.service.conftest import tiny_model  # noqa: F401
from tests.workers import WorkerProc

ROOT = Path(__file__).resolve().parents[2]
SERVED = "tiny-cluster-celery"
GREEDY = {"max_tokens": 6, "temperature": 0, "ignore_eos": True}


def test_celery_on_its_own_redis_with_jobs_on_the_cluster(redis_cluster, redis_url, tiny_model, tmp_path,
                                                         monkeypatch):
    env = {**redis_cluster.env(), "INFERQ_PARTITIONS": "2", "INFERQ_CELERY_BROKER_URL": redis_url}
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    # Without its own broker, Celery on a cluster refuses with a clear message.
    from producer.celery_app import CelerySettings, broker_url

    with pytest.raises(ValueError, match="INFERQ_CELERY_BROKER_URL"):
        broker_url(CelerySettings(celery_broker_url=None))

    worker = WorkerProc(redis_cluster.url, tiny_model, SERVED, tmp_path, "celery-cluster-w")
    celery = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "producer.celery_app", "worker", "-P", "threads", "-c", "2",
         "-Q", "inferq", "-n", "cluster@%h", "--without-mingle", "--without-gossip", "-l", "info"],
        cwd=tmp_path, env=env_without("INFERQ_REDIS_URL", PYTHONPATH=str(ROOT), **env),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out = LineReader(celery.stdout)
    r = sync_client(RedisSettings())
    try:
        end = time.monotonic() + 180
        while r.zscore(keys.workers(SERVED), "celery-cluster-w") is None or not any("ready." in x for x in out.lines):
            assert worker.proc.poll() is None and celery.poll() is None and time.monotonic() < end, out.text()
            time.sleep(0.1)
        # A client app of its own (the tasks module's app may already hold another broker's pool).
        from celery import Celery

        client = Celery("cluster-client", broker=redis_url, backend=redis_url)
        results = [client.send_task("inferq.generate", args=[f"Hello {i}"], kwargs={"model": SERVED, "sampling": GREEDY},
                                    queue="inferq") for i in range(6)]
        p = Producer(default_model=SERVED)
        for res in results:
            got = res.get(timeout=180)
            direct = p.job(got["job_id"]).result(timeout=10)  # the job is on the cluster
            assert got["token_ids"] == direct.token_ids and len(got["token_ids"]) == 6
        # Nothing of the queue went to Celery's Redis.
        import redis as redis_lib

        broker = redis_lib.Redis.from_url(redis_url)
        assert not list(broker.scan_iter(match="inferq:*"))
        broker.close()
        p.close()
        client.close()
    finally:
        r.close()
        celery.send_signal(signal.SIGTERM)
        try:
            celery.wait(20)
        except subprocess.TimeoutExpired:
            celery.kill()
        worker.kill()
        worker.terminate()
