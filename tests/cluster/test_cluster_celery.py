"""Celery beside a Redis Cluster: kombu's Redis transport cannot use a cluster,
so Celery's broker and result backend are a standalone Redis of their own
(INFERQ_CELERY_BROKER_URL) while the jobs live on the cluster. A real `celery
worker` process runs the generate task against a real inferq worker."""
from __future__ import annotations

from pathlib import Path

import pytest

from inferq.producer import Producer
from inferq.schemas import keys
from inferq.schemas.connection import RedisSettings, sync_client
from tests.celery.conftest import launch_celery, stop_celery
from tests.cli.procs import env_without
from tests.service.conftest import tiny_model, wait_for  # noqa: F401
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
    from inferq.producer.celery_app import CelerySettings, broker_url

    with pytest.raises(ValueError, match="INFERQ_CELERY_BROKER_URL"):
        broker_url(CelerySettings(celery_broker_url=None))

    worker = WorkerProc(redis_cluster.url, tiny_model, SERVED, tmp_path, "celery-cluster-w")
    celery, out = launch_celery(env_without("INFERQ_REDIS_URL", PYTHONPATH=str(ROOT), **env), tmp_path, "cluster",
                                concurrency=2)
    r = sync_client(RedisSettings())
    try:
        def both_ready() -> bool:
            assert worker.proc.poll() is None and celery.poll() is None, out.text()
            return r.zscore(keys.workers(SERVED), "celery-cluster-w") is not None and \
                any("ready." in x for x in out.lines)

        wait_for(both_ready, 180, what="the inferq worker and the celery worker ready")
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
        stop_celery(celery)
        worker.kill()
        worker.terminate()
