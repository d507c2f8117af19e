"""Bounded work per view with 10,000 jobs and 100 lanes in Redis (inferq/bench/dashboard_scale.py):
each JSON view costs a fixed number of Redis commands (the queues view a few
per lane, the others a handful), never a KEYS or SCAN once the model list is
cached, and lists come in pages. Counted with INFO commandstats, so the check
does not depend on the machine's speed; the answer times are in
docs/benchmarks.md ("Dashboard views at 10,000 jobs")."""
import json
import time

import httpx
import pytest
import redis

from tests.conftest import RedisServer
from inferq.bench import dashboard_scale as scale
from tests.gateway.stack import running_gateway


@pytest.fixture(scope="module")
def big(tmp_path_factory):
    # A server of its own: INFO commandstats counts every client, and the session's
    # shared server may have readers left from other tests.
    server = RedisServer(tmp_path_factory.mktemp("redis-scale")).start()
    r = redis.Redis.from_url(server.url)
    ids = scale.fill(r)
    # The charts' sampler reads Redis in the background (once when first woken, then every
    # dashboard_sample_s): an hour apart here, so it does not add to the views' counts.
    with running_gateway(server.url, files_dir=str(tmp_path_factory.mktemp("files")),
                         dashboard_sample_s=3600.0) as url:
        with httpx.Client(base_url=url, timeout=60) as c:
            yield r, c, ids
    r.close()
    server.stop()


def test_each_view_costs_a_bounded_number_of_redis_commands(big):
    r, c, ids = big
    n_lanes = len(scale.lanes())
    assert n_lanes == 100 and r.dbsize() > scale.JOBS
    paths = scale.views(ids[1234])
    for path in paths.values():
        c.get(path).raise_for_status()  # warm: the model list is cached after the first view
    # The first view woke the charts' sampler: its one sample (a queues read of its own,
    # in a thread) may still be running and would land in the counts below on a busy
    # machine. Wait until it is in the ring (workers' sampled_at), then it sleeps an hour.
    for _ in range(6000):
        if c.get("/dashboard/api/workers").json()["sampled_at"] is not None:
            break
        time.sleep(0.01)
    else:
        pytest.fail("the dashboard sampler took no sample in 6,000 polls")
    budget = {"queues": 3 * n_lanes + 10, "workers": 5, "series": 2, "dlq": 5, "job": 3, "batches": 3}
    for name, path in paths.items():
        # INFO commandstats counts the whole server: of three calls keep the cheapest, so
        # a background read (a batch resume, the model-list refresh) cannot land in all.
        calls = min((scale.cost(r, lambda: c.get(path).raise_for_status()) for _ in range(3)),
                    key=lambda x: sum(x.values()))
        assert "keys" not in calls and "scan" not in calls, (name, calls)
        assert sum(calls.values()) <= budget[name], (name, calls)


def test_lists_come_in_pages(big):
    r, c, _ = big
    q = c.get("/dashboard/api/queues", params={"lane_limit": 10}).json()["data"][0]
    assert q["lanes_total"] == 101 and len(q["lanes"]) == 10  # + the (empty) default lane
    assert q["waiting"] + q["pending"] == scale.JOBS and q["pending"] == scale.JOBS // 10
    second = c.get("/dashboard/api/queues", params={"lane_limit": 10, "lane_offset": 10}).json()["data"][0]["lanes"]
    assert {(ln["cls"], ln["tenant"]) for ln in q["lanes"]}.isdisjoint({(ln["cls"], ln["tenant"]) for ln in second})
    seen, cursor = [], None
    for _ in range(10):
        page = c.get("/dashboard/api/dlq", params={"limit": 60, **({"cursor": cursor} if cursor else {})}).json()
        assert len(page["data"]) <= 60
        seen += [e["dlq_id"] for e in page["data"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert len(seen) == len(set(seen)) == scale.DLQ
    assert c.get("/dashboard/api/dlq", params={"limit": 1000}).status_code == 400  # a page has a cap
    assert c.get("/dashboard/api/dlq", params={"cursor": json.dumps(["x"])}).status_code == 400
