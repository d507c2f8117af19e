"""The whole queue on a real 3-master/3-replica Redis Cluster: jobs from the
SDK, the async SDK and the gateway (official openai client, real HTTP) over 2
partitions and 2 workers end with the offline engine's greedy text; a master
is killed mid-run, its replica takes over, and every job still ends with
exactly one final event. Then work stealing across partitions."""
from __future__ import annotations

import asyncio
import threading

import pytest
import redis
from redis.crc import key_slot

from inferq.producer import AsyncProducer, Producer
from inferq.schemas import SamplingParams, decode_event, keys
from inferq.schemas.connection import RedisSettings, sync_client
from tests.gateway.stack import running_gateway
from tests.service.conftest import offline_llm, start_worker, tiny_model, wait_for  # noqa: F401
from tests.workers import WorkerProc

GREEDY = {"temperature": 0.0, "ignore_eos": True, "max_tokens": 8}
SERVED = "tiny-cluster"


@pytest.fixture
def cluster_env(disposable_redis_cluster, monkeypatch):
    for k, v in {**disposable_redis_cluster.env(), "INFERQ_PARTITIONS": "2"}.items():
        monkeypatch.setenv(k, v)
    return disposable_redis_cluster


def cluster_client() -> redis.RedisCluster:
    return sync_client(RedisSettings())


def start_cluster_worker(tmp_path, procs, cluster, worker_id, *extra) -> WorkerProc:
    w = WorkerProc(cluster.url, tiny_model_path[0], SERVED, tmp_path, worker_id, *extra)
    procs.append(w)
    r = cluster_client()

    def registered() -> bool:
        if w.proc.poll() is not None:
            raise RuntimeError(f"worker {worker_id} exited:\n{w.log()[-3000:]}")
        return r.zscore(keys.workers(SERVED), worker_id) is not None

    try:
        wait_for(registered, 180, what=f"worker {worker_id} registered")
    finally:
        r.close()
    return w


tiny_model_path: list = []


@pytest.fixture
def workers(tmp_path, tiny_model):
    tiny_model_path[:] = [tiny_model]
    procs: list[WorkerProc] = []
    yield procs
    for w in procs:
        w.kill()
        w.terminate()


def final_events(r, job_id: str) -> list:
    return [ev for _, f in r.xrange(keys.reply(job_id)) if (ev := decode_event(f)).type in ("done", "error")]


def test_jobs_from_every_producer_survive_a_master_failover(cluster_env, workers, tmp_path, offline_llm):
    cluster = cluster_env
    for wid in ("cw-1", "cw-2"):
        start_cluster_worker(tmp_path, workers, cluster, wid, "--max-num-seqs", "8", "--step-pace-s", "0.02")
    prompts = [[5, (i % 90) + 1, (i * 7) % 50 + 1] for i in range(200)]
    want = offline_llm.generate(prompts, SamplingParams(**GREEDY))

    # Accepted jobs must survive the failover: admission waits for one replica (WAIT).
    p = Producer(default_model=SERVED, admission_replicas=1)
    ids: dict[int, str] = {}
    for i in range(0, 80):
        ids[i] = p.submit(prompt_token_ids=prompts[i], sampling=GREEDY).id

    async def async_submit():
        ap = AsyncProducer(default_model=SERVED, admission_replicas=1)
        try:
            for i in range(80, 160):
                ids[i] = (await ap.submit(prompt_token_ids=prompts[i], sampling=GREEDY)).id
        finally:
            await ap.close()

    asyncio.run(async_submit())
    assert {keys.partition_of(j) for j in ids.values()} == {0, 1}

    from openai import OpenAI

    gateway_texts: dict[int, str] = {}
    errors: list = []
    with running_gateway(cluster.url, producer={"admission_replicas": 1}) as url:
        client = OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=5)

        def via_gateway(i):
            try:
                out = client.completions.create(model=SERVED, prompt=prompts[i], max_tokens=8, temperature=0.0,
                                                extra_body={"ignore_eos": True})
                gateway_texts[i] = out.choices[0].text
            except Exception as e:  # surfaced below
                errors.append((i, e))

        threads = [threading.Thread(target=via_gateway, args=(i,)) for i in range(160, 200)]
        for t in threads:
            t.start()
        # Mid-run: some jobs done, others still queued or running. Kill the master
        # of partition 0's slot; its replica takes over.
        r = cluster_client()

        def done() -> int:
            return sum(1 for j in ids.values() if r.hget(keys.job_info(j), "status") == b"done")

        wait_for(lambda: done() >= 20, 180, what="20 jobs done before the kill")
        # The pace (0.02 s a step) leaves the other ~180 jobs seconds of work: mid-run.
        assert done() < 160
        slot = key_slot(keys.jobs(SERVED, 0).encode())
        cluster.kill_master_of_slot(slot)
        cluster.wait_failover(slot)
        for t in threads:
            t.join(300)
    assert not errors, errors[:3]

    for i in range(160):
        res = p.job(ids[i]).result(timeout=300)
        assert res.token_ids == want[i].token_ids, i
    for i in range(160, 200):
        assert gateway_texts[i] == want[i].text, i
    # Exactly one final event per job (a done lost with the old master is re-run, not doubled).
    for j in ids.values():
        assert len(final_events(p.redis, j)) == 1, j
    p.close()


def test_an_idle_worker_takes_every_partitions_jobs(cluster_env, workers, tmp_path, offline_llm):
    """Work stealing: with 2 partitions and one worker stopped, the other finishes every job."""
    cluster = cluster_env
    p = Producer(default_model=SERVED)
    prompts = [[9, i + 1] for i in range(40)]
    handles = [p.submit(prompt_token_ids=ids, sampling=GREEDY) for ids in prompts]
    assert {keys.partition_of(h.id) for h in handles} == {0, 1}
    w = start_cluster_worker(tmp_path, workers, cluster, "only-worker", "--max-num-seqs", "4")
    want = offline_llm.generate(prompts, SamplingParams(**GREEDY))
    for h, exp in zip(handles, want):
        assert h.result(timeout=300).token_ids == exp.token_ids
        assert h.status()["worker"] == w.worker_id
    p.close()


def test_the_cli_and_housekeeping_work_on_the_cluster(redis_cluster, monkeypatch):
    """`inferq status` and `inferq dlq` read every partition's keys across the
    shards; the Celery housekeeping runs its fenced scripts on the cluster."""
    import json
    import subprocess
    import sys

    from inferq.producer.maintenance import MaintenanceSettings, run_all
    from tests.cli.procs import env_without

    env = {**redis_cluster.env(), "INFERQ_PARTITIONS": "2"}
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    p = Producer(default_model="cli-cluster")
    handles = [p.submit(prompt_token_ids=[1, i + 1], sampling=GREEDY, priority_class="batch" if i % 2 else
                        "interactive") for i in range(6)]
    r = cluster_client()
    # A job dead-lettered by hand-made garbage on partition 1's stream: the DLQ of that partition.
    garbage = keys.jobs("cli-cluster-dlq", 1)
    r.xgroup_create(garbage, keys.JOBS_GROUP, id="0", mkstream=True)
    r.xadd(garbage, {"job": "not json"})
    r.xreadgroup(keys.JOBS_GROUP, "gone-worker", {garbage: ">"}, count=10)
    report = run_all(r, MaintenanceSettings(lease_seconds=0.001, max_deliveries=1))
    assert report["cli-cluster-dlq"]["dead_lettered"] == 1

    cli_env = env_without("INFERQ_REDIS_URL", **env)
    out = subprocess.run([sys.executable, "-m", "inferq.cli", "status", "--json"], env=cli_env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    row = next(m for m in json.loads(out.stdout) if m["model"] == "cli-cluster")
    assert row["by_class"]["interactive"]["waiting"] + row["by_class"]["batch"]["waiting"] == len(handles)
    assert {ln["partition"] for ln in row["lanes"]} == {0, 1}
    dl = subprocess.run([sys.executable, "-m", "inferq.cli", "dlq", "list", "--json"], env=cli_env,
                        capture_output=True, text=True, timeout=120)
    assert dl.returncode == 0, dl.stderr
    assert [x["code"] for x in json.loads(dl.stdout) if x["model"] == "cli-cluster-dlq"] == ["max_deliveries"]
    r.close()
    p.close()
