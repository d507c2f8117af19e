"""The Batch API under cancel and failures, with real processes: a paced worker
(--step-pace-s) keeps the batch surely mid-run while the test acts, and every
wait is on observed progress (request counts, the job map), never on time."""
from __future__ import annotations

import json
import time

import pytest
import redis
from openai import OpenAI

from inferq.schemas import keys
from inferq.schemas.text import as_str
from tests.conftest import RedisServer
from tests.gateway.stack import running_gateway
from tests.workers import WorkerProc


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    s = RedisServer(tmp_path_factory.mktemp("redis-batch")).start()
    yield s
    s.stop()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from tests.tiny_models import save_tiny_model

    return save_tiny_model("llama", tmp_path_factory.mktemp("tiny") / "llama")


@pytest.fixture
def workers(tmp_path):
    procs: list[WorkerProc] = []

    def start(url, model_dir, served, wid, *extra) -> WorkerProc:
        w = WorkerProc(url, model_dir, served, tmp_path, wid, *extra)
        procs.append(w)
        return w.wait_ready()

    yield start
    for w in procs:
        w.kill()
        w.terminate()


def lines_for(model: str, n: int, max_tokens: int) -> tuple[bytes, dict[str, dict]]:
    bodies = {f"r{i}": {"model": model, "messages": [{"role": "user", "content": f"Tell me about {i}"}],
                        "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True} for i in range(n)}
    data = "\n".join(json.dumps({"custom_id": k, "method": "POST", "url": "/v1/chat/completions", "body": v})
                     for k, v in bodies.items())
    return data.encode(), bodies


def client(url: str) -> OpenAI:
    return OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=60)


def wait_batch(c: OpenAI, batch_id: str, pred, what: str, timeout: float = 300):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        b = c.batches.retrieve(batch_id)
        if pred(b):
            return b
        time.sleep(0.1)
    raise TimeoutError(f"{what}: batch stayed {b.status} {b.request_counts}")


def outputs(c: OpenAI, file_id) -> list[dict]:
    if file_id is None:
        return []
    return [json.loads(x) for x in c.files.content(file_id).text.splitlines() if x.strip()]


def job_map(url: str, batch_id: str) -> dict[str, str]:
    r = redis.Redis.from_url(url)
    try:
        return {as_str(k): as_str(v) for k, v in r.hgetall(keys.batch_jobs(batch_id)).items()}
    finally:
        r.close()


def test_cancel_mid_run_stops_the_remaining_lines(server, tiny, workers, tmp_path):
    model = "bt-cancel"
    workers(server.url, tiny, model, "c1", "--step-pace-s", "0.1", "--max-num-seqs", "4")
    data, bodies = lines_for(model, 30, max_tokens=10)  # >= 1 s per line, 4 at a time: >= 8 s in all
    with running_gateway(server.url, files_dir=str(tmp_path / "files"), batch_max_in_flight=4) as url:
        c = client(url)
        f = c.files.create(file=("in.jsonl", data), purpose="batch")
        b = c.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h")
        wait_batch(c, b.id, lambda x: x.request_counts.completed >= 1, "first line done")
        cancelled = c.batches.cancel(b.id)
        assert cancelled.status == "cancelling" and cancelled.cancelling_at
        b = wait_batch(c, b.id, lambda x: x.status not in ("cancelling", "in_progress"), "cancelled")
        assert b.status == "cancelled" and b.cancelled_at
        submitted = job_map(server.url, b.id)
        out, errs = outputs(c, b.output_file_id), outputs(c, b.error_file_id)
        counts = b.request_counts
        # The remaining lines stopped: fewer ran than the batch had, and nothing more is submitted.
        assert counts.total == 30 and counts.completed < 30
        assert len(out) == counts.completed and counts.failed == 0
        stopped = [e for e in errs if e["error"]["code"] == "batch_cancelled"]
        assert stopped and len(out) + len(stopped) == counts.total
        assert {o["custom_id"] for o in out}.isdisjoint({e["custom_id"] for e in stopped})
        assert len(submitted) < 30
        # No job of the batch is left queued or running.
        r = redis.Redis.from_url(server.url)
        try:
            assert r.xlen(keys.jobs(model)) == 0
            assert r.xpending(keys.jobs(model), keys.JOBS_GROUP)["pending"] == 0
            # The driver has let go of the batch (its lease is gone), and it had
            # submitted nothing more by then.
            end = time.monotonic() + 60
            while r.exists(keys.batch_lease(b.id)):
                assert time.monotonic() < end, "the batch driver never let go of the cancelled batch"
                time.sleep(0.05)
        finally:
            r.close()
        assert job_map(server.url, b.id) == submitted


def test_worker_killed_mid_batch_loses_nothing(server, tiny, workers, tmp_path):
    model = "bt-kill"
    first = workers(server.url, tiny, model, "k1", "--step-pace-s", "0.1", "--max-num-seqs", "4")
    data, bodies = lines_for(model, 12, max_tokens=8)
    with running_gateway(server.url, files_dir=str(tmp_path / "files"), batch_max_in_flight=4) as url:
        c = client(url)
        f = c.files.create(file=("in.jsonl", data), purpose="batch")
        b = c.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h")
        wait_batch(c, b.id, lambda x: x.request_counts.completed >= 2, "two lines done")
        first.kill()  # mid-batch: lines are running on it and more are queued
        assert c.batches.retrieve(b.id).request_counts.completed < 12
        workers(server.url, tiny, model, "k2")
        b = wait_batch(c, b.id, lambda x: x.status == "completed", "completed after the kill")
        assert b.request_counts.completed == 12 and b.request_counts.failed == 0
        out = outputs(c, b.output_file_id)
        assert sorted(o["custom_id"] for o in out) == sorted(bodies)
        for o in out:
            alone = c.chat.completions.create(**{k: v for k, v in bodies[o["custom_id"]].items()
                                                if k != "ignore_eos"}, extra_body={"ignore_eos": True})
            assert o["response"]["body"]["choices"][0]["message"]["content"] == alone.choices[0].message.content


def test_batch_survives_a_gateway_restart(server, tiny, workers, tmp_path):
    model = "bt-restart"
    workers(server.url, tiny, model, "g1", "--step-pace-s", "0.1", "--max-num-seqs", "4")
    data, bodies = lines_for(model, 16, max_tokens=6)
    files_dir = str(tmp_path / "files")
    with running_gateway(server.url, files_dir=files_dir, batch_max_in_flight=4) as url:
        c = client(url)
        f = c.files.create(file=("in.jsonl", data), purpose="batch")
        b = c.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h")
        wait_batch(c, b.id, lambda x: x.request_counts.completed >= 2, "two lines done")
    # The first gateway is gone mid-batch; a new one on the same Redis and files dir takes over.
    before = job_map(server.url, b.id)
    assert 2 <= len(before) < 16
    with running_gateway(server.url, files_dir=files_dir, batch_max_in_flight=4) as url:
        c = client(url)
        b = wait_batch(c, b.id, lambda x: x.status == "completed", "completed after the restart")
        assert b.request_counts.completed == 16 and b.request_counts.failed == 0
        out = outputs(c, b.output_file_id)
        after = job_map(server.url, b.id)
    assert sorted(o["custom_id"] for o in out) == sorted(bodies)  # each line exactly once
    # Lines enqueued before the restart kept their job (never enqueued twice).
    assert all(after[k] == v for k, v in before.items())
    assert {o["custom_id"]: o["response"]["request_id"] for o in out} == after
    assert len(set(after.values())) == 16


def test_lines_whose_results_expired_while_no_gateway_ran_are_run_again(server, tiny, workers, tmp_path):
    """A gateway down longer than the reply TTL: the lines that finished meanwhile
    left no result to read; the next gateway runs them again instead of losing them."""
    model = "bt-expired"
    workers(server.url, tiny, model, "e1", "--step-pace-s", "0.1", "--max-num-seqs", "4")
    data, bodies = lines_for(model, 10, max_tokens=6)
    files_dir = tmp_path / "files"
    with running_gateway(server.url, files_dir=str(files_dir), batch_max_in_flight=4) as url:
        c = client(url)
        f = c.files.create(file=("in.jsonl", data), purpose="batch")
        b = c.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h")
        wait_batch(c, b.id, lambda x: x.request_counts.completed >= 1, "a line done")
    before = job_map(server.url, b.id)
    partial = files_dir / f"batch_{b.id}.output.partial"
    recorded = {json.loads(x)["custom_id"] for x in partial.read_text().splitlines()}
    lost = {cid: job for cid, job in before.items() if cid not in recorded}
    assert lost  # lines enqueued but not yet written when the gateway stopped
    r = redis.Redis.from_url(server.url)
    try:
        for job in lost.values():  # let them finish, then expire their results
            end = time.monotonic() + 120
            while as_str(r.hget(keys.job_info(job), "status") or b"") not in ("done", "error", "cancelled"):
                assert time.monotonic() < end, f"job {job} did not finish"
                time.sleep(0.05)
            r.delete(keys.reply(job), keys.job_info(job))
    finally:
        r.close()
    with running_gateway(server.url, files_dir=str(files_dir), batch_max_in_flight=4) as url:
        c = client(url)
        b = wait_batch(c, b.id, lambda x: x.status == "completed", "completed after the results expired")
        assert b.request_counts.completed == 10 and b.request_counts.failed == 0
        out = {o["custom_id"]: o for o in outputs(c, b.output_file_id)}
    assert sorted(out) == sorted(bodies)
    for cid, job in lost.items():
        assert out[cid]["response"]["request_id"] != job  # ran again as a new job
        assert out[cid]["response"]["body"]["choices"][0]["message"]["content"]


def test_expired_batch_stops_and_reports_the_rest(server, tiny, workers, tmp_path):
    """completion_window is 24h; the test moves expires_at to now mid-run (as the
    clock would) and the batch ends `expired` with the unrun lines reported."""
    model = "bt-expire"
    workers(server.url, tiny, model, "x1", "--step-pace-s", "0.1", "--max-num-seqs", "4")
    data, bodies = lines_for(model, 20, max_tokens=10)
    with running_gateway(server.url, files_dir=str(tmp_path / "files"), batch_max_in_flight=4) as url:
        c = client(url)
        f = c.files.create(file=("in.jsonl", data), purpose="batch")
        b = c.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h")
        wait_batch(c, b.id, lambda x: x.request_counts.completed >= 1, "a line done")
        r = redis.Redis.from_url(server.url)
        r.hset(keys.batch(b.id), "expires_at", int(time.time()))
        r.close()
        b = wait_batch(c, b.id, lambda x: x.status not in ("in_progress", "finalizing"), "expired")
        assert b.status == "expired" and b.expired_at
        out, errs = outputs(c, b.output_file_id), outputs(c, b.error_file_id)
        assert 1 <= b.request_counts.completed < 20 and b.request_counts.failed == 0
        assert len(out) == b.request_counts.completed
        assert len(errs) == 20 - len(out) and all(e["error"]["code"] == "batch_expired" for e in errs)
