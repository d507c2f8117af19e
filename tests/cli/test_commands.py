"""The CLI commands as a user runs them (subprocesses) against a real worker."""
import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import redis

from inferq.producer import Producer
from inferq.schemas import keys
from tests.cli.procs import env_without
from tests.conftest import free_port
from tests.gateway.stack import TINY

ROOT = Path(__file__).resolve().parents[2]


def inferq(stack_url, *args, timeout=120, input=None):
    env = env_without("INFERQ_REDIS_URL", INFERQ_REDIS_URL=stack_url, PYTHONPATH=str(ROOT), COLUMNS="200")
    return subprocess.run([sys.executable, "-m", "inferq.cli", *args], env=env, capture_output=True,
                          text=True, timeout=timeout, input=input)


def job_id_from(stderr: str) -> str:
    m = re.search(r"job ([0-9a-f]{32})", stderr)
    assert m, stderr
    return m.group(1)


def test_submit_streams_the_text(stack):
    r = inferq(stack.url, "submit", "The capital of France is", "--model", TINY, "--max-tokens", "8",
               "--ignore-eos")
    assert r.returncode == 0, r.stderr
    job = job_id_from(r.stderr)
    result = Producer(stack.url).job(job).result(timeout=10)
    assert r.stdout == result.text + "\n"
    assert "finish=length" in r.stderr and "completion_tokens=8" in r.stderr


def test_detach_then_stream_and_events(stack):
    r = inferq(stack.url, "submit", "Tell me", "--model", TINY, "--max-tokens", "6", "--detach")
    assert r.returncode == 0, r.stderr
    job = r.stdout.strip()
    assert re.fullmatch(r"[0-9a-f]{32}", job)
    text = inferq(stack.url, "stream", job)
    assert text.returncode == 0, text.stderr
    result = Producer(stack.url).job(job).result(timeout=10)
    assert text.stdout == result.text + "\n"
    events = inferq(stack.url, "stream", job, "--events")
    lines = [json.loads(x) for x in events.stdout.splitlines()]
    assert [e["type"] for e in lines][:2] == ["queued", "started"]
    assert lines[-1]["type"] == "done"
    # Resume after an entry id: only what came after it.
    third = lines[2]["id"]
    resumed = inferq(stack.url, "stream", job, "--events", "--from", third)
    assert [json.loads(x)["id"] for x in resumed.stdout.splitlines()] == [e["id"] for e in lines[3:]]


def test_cancel_stops_a_running_job(stack):
    job = inferq(stack.url, "submit", "Go", "--model", TINY, "--max-tokens", "3000", "--ignore-eos",
                 "--detach").stdout.strip()
    p = Producer(stack.url)
    for _, ev in p.job(job).stream(timeout=60):
        if ev.type == "delta":
            break
    r = inferq(stack.url, "cancel", job)
    assert r.returncode == 0 and "cancel requested" in r.stdout
    res = p.job(job).result(timeout=60)
    assert res.finish_reason == "abort" and len(res.token_ids) < 3000
    again = inferq(stack.url, "cancel", job)
    assert "already finished (cancelled)" in again.stdout


def test_unknown_job_is_a_clear_error(stack):
    r = inferq(stack.url, "stream", "nosuchjob")
    assert r.returncode == 1 and "not found" in r.stderr


def test_status_shows_queue_and_workers(stack):
    r = inferq(stack.url, "status", "--json")
    assert r.returncode == 0, r.stderr
    rows = {row["model"]: row for row in json.loads(r.stdout)}
    assert rows[TINY]["workers_alive"] >= 1
    assert {"depth", "waiting", "pending", "dlq", "oldest_waiting_s"} <= set(rows[TINY])
    table = inferq(stack.url, "status")
    assert TINY in table.stdout and "alive" in table.stdout


def test_dlq_list_retry_purge(stack):
    p = Producer(stack.url)
    p.redis.delete(keys.dlq(TINY))
    # Token ids beyond the vocabulary: the worker refuses the job into the DLQ.
    bad = p.submit(prompt_token_ids=[10**7], model=TINY, sampling={"max_tokens": 2})
    with pytest.raises(Exception, match="invalid_prompt"):
        bad.result(timeout=60)
    listed = json.loads(inferq(stack.url, "dlq", "list", "--model", TINY, "--json").stdout)
    assert [e["job_id"] for e in listed] == [bad.id] and listed[0]["code"] == "invalid_prompt"
    table = inferq(stack.url, "dlq", "list").stdout
    assert bad.id in table and "invalid_prompt" in table

    r = inferq(stack.url, "dlq", "retry", listed[0]["dlq_id"], "--model", TINY)
    assert r.returncode == 0, r.stderr
    assert f"requeued job {bad.id}" in r.stdout
    # It runs again under the same id (and, still invalid, lands in the DLQ again).
    with pytest.raises(Exception, match="invalid_prompt"):
        p.job(bad.id).result(timeout=60)
    relisted = json.loads(inferq(stack.url, "dlq", "list", "--model", TINY, "--json").stdout)
    assert [e["job_id"] for e in relisted] == [bad.id]
    assert relisted[0]["dlq_id"] != listed[0]["dlq_id"]

    assert inferq(stack.url, "dlq", "purge", "--model", TINY, input="n\n").returncode == 1
    r = inferq(stack.url, "dlq", "purge", "--model", TINY, "--yes")
    assert r.returncode == 0 and "deleted 1" in r.stdout
    assert p.redis.xlen(keys.dlq(TINY)) == 0


def test_doctor_reads_a_real_worker(stack):
    r = inferq(stack.url, "doctor", "--metrics-url", f"http://127.0.0.1:{stack.metrics_port}/metrics",
               "--interval", "0.5", "--json")
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    assert report["readings"]["max_num_seqs"] == 16  # the worker's own configuration
    assert report["readings"]["max_num_batched_tokens"] > 0
    assert report["bottleneck"] in ("none", "queue", "kv_cache", "token_budget", "max_num_seqs")
    human = inferq(stack.url, "doctor", "--metrics-url", f"http://127.0.0.1:{stack.metrics_port}/metrics",
                   "--interval", "0.2")
    assert "kv_cache_usage" in human.stdout and "→" in human.stdout


def test_doctor_without_a_worker_says_how_to_point_it(stack):
    r = inferq(stack.url, "doctor", "--metrics-url", f"http://127.0.0.1:{free_port()}/metrics", "--interval", "0")
    assert r.returncode == 1 and "--metrics-url" in r.stderr


def test_worker_command_passes_flags_through(stack):
    r = inferq(stack.url, "worker", "--help")
    assert r.returncode == 0 and "--max-num-seqs" in r.stdout


def test_gateway_command_serves_and_stops_on_sigterm(stack):
    port = free_port()
    env = env_without("INFERQ_REDIS_URL", INFERQ_REDIS_URL=stack.url, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen([sys.executable, "-m", "inferq.cli", "gateway", "--port", str(port)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        end = time.monotonic() + 30
        while True:
            try:
                health = httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).json()
                break
            except httpx.TransportError:
                assert time.monotonic() < end and proc.poll() is None, "gateway did not come up"
                time.sleep(0.2)
        assert health["models"][TINY]["live_workers"] >= 1
        proc.send_signal(signal.SIGTERM)
        # uvicorn shuts down gracefully, then re-raises the signal (exit status -15).
        assert proc.wait(20) in (0, -signal.SIGTERM)
        assert "Finished server process" in proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()


def test_redis_unreachable_is_a_clear_error():
    r = inferq(f"redis://127.0.0.1:{free_port()}/0", "status")
    assert r.returncode == 1 and "cannot reach Redis" in r.stderr


def test_dlq_retry_refused_by_admission_keeps_everything(redis_url, monkeypatch):
    """A re-admission the queue refuses (here: the backlog is at its bound)
    leaves the DLQ entry, the job record and its reply stream as they were."""
    from inferq.schemas import ErrorEvent, Job, encode_event, records

    r = redis.Redis.from_url(redis_url)
    job = Job(model="dlqm", prompt="x")
    r.hset(keys.job_info(job.id), mapping={"status": "error", "error_code": "invalid_prompt", "attempt": 1})
    r.xadd(keys.reply(job.id), encode_event(ErrorEvent(attempt=1, seq=0, code="invalid_prompt", message="m")))
    dead = records.DeadLetter(job=job.model_dump_json(), job_id=job.id, entry_id="1-0", code="invalid_prompt",
                              reason="m", attempts=1, worker="w", failed_at=time.time())
    dlq_id = r.xadd(keys.dlq("dlqm"), dead.to_fields()).decode()
    r.xadd(keys.jobs("dlqm"), Job(model="dlqm", prompt="waiting").to_fields())  # the backlog: 1 job
    monkeypatch.setenv("INFERQ_MAX_BACKLOG", "1")
    out = inferq(redis_url, "dlq", "retry", dlq_id, "--model", "dlqm")
    assert out.returncode == 1 and "not requeued" in out.stderr and "full" in out.stderr
    assert [e[0].decode() for e in r.xrange(keys.dlq("dlqm"))] == [dlq_id]
    assert r.hget(keys.job_info(job.id), "status") == b"error" and r.xlen(keys.reply(job.id)) == 1
    r.close()


def test_submit_with_a_json_schema_file(stack, tmp_path):
    # Even the tiny random model can only write what the schema allows.
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}, "colour": {"enum": ["red", "blue"]}},
              "required": ["ok", "colour"], "additionalProperties": False}
    path = tmp_path / "schema.json"
    path.write_text(json.dumps(schema))
    r = inferq(stack.url, "submit", "Answer", "--model", TINY, "--max-tokens", "40", "--json-schema", str(path))
    assert r.returncode == 0, r.stderr
    answer = json.loads(r.stdout)
    assert isinstance(answer["ok"], bool) and answer["colour"] in ("red", "blue") and set(answer) == {"ok", "colour"}
    assert "finish=stop" in r.stderr
    choice = inferq(stack.url, "submit", "Pick", "--model", TINY, "--choice", "left", "--choice", "right")
    assert choice.returncode == 0 and choice.stdout.strip() in ("left", "right"), choice.stderr
    path.write_text(json.dumps({"type": "array", "uniqueItems": True}))
    bad = inferq(stack.url, "submit", "Answer", "--model", TINY, "--json-schema", str(path))
    assert bad.returncode == 1 and "uniqueItems" in bad.stderr
