"""Webhooks end to end on real processes: a worker, gateways run as their own
processes (one is killed with SIGKILL mid-run), and a receiver process that
verifies every delivery with the official SDK's ``client.webhooks.unwrap``.

1,000 jobs end while the gateway is killed in the middle of deliveries (the
receiver got them, the gateway never heard back), the receiver is down for part
of the run and a new gateway process takes over: every event arrives verified,
none is lost, and the deliveries the crash interrupted arrive again under the
same ``webhook-id`` with the same body."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import openai
import pytest
import redis

from inferq.producer import Producer
from inferq.schemas import keys
from inferq.schemas.completion_events import event_id
from tests.conftest import free_port
from tests.gateway.stack import TINY

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.timeout(600)


def wait_for(cond, timeout: float, what: str, every: float = 0.1):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        value = cond()
        if value:
            return value
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


class Receiver:
    """tests/gateway/webhook_receiver.py as a process; stop() and start() again on the same port."""

    def __init__(self, tmp: Path, failing: bool = False):
        self.port, self.failing, self.holding = free_port(), failing, False
        self.log = tmp / f"received-{self.port}.jsonl"
        self.secret_file = tmp / f"secret-{self.port}"
        self.proc = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hook"

    def start(self) -> "Receiver":
        args = [sys.executable, "-m", "tests.gateway.webhook_receiver", str(self.port), str(self.secret_file), str(self.log)]
        mode = ["fail"] if self.failing else (["hold"] if self.holding else [])
        self.proc = subprocess.Popen(args + mode, cwd=REPO, stdout=subprocess.PIPE,
                                     env=dict(os.environ, PYTHONPATH=str(REPO)))
        assert self.proc.stdout.readline().strip() == b"ready"
        return self

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def received(self) -> list[dict]:
        if not self.log.exists():
            return []
        return [json.loads(x) for x in self.log.read_text().splitlines() if x.strip()]


class Gateway:
    """``python -m inferq.producer.gateway`` as a process."""

    def __init__(self, tmp: Path, redis_url: str, **env: str):
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.log_path = tmp / f"gateway-{self.port}.log"
        full = dict(os.environ, PYTHONPATH=str(REPO), INFERQ_REDIS_URL=redis_url,
                    INFERQ_GATEWAY_FILES_DIR=str(tmp / "files"), INFERQ_GATEWAY_WEBHOOK_ALLOW_HTTP="true",
                    INFERQ_GATEWAY_WEBHOOK_BACKOFF_S="0.2", INFERQ_GATEWAY_WEBHOOK_BACKOFF_MAX_S="1",
                    INFERQ_GATEWAY_WEBHOOK_TIMEOUT_S="5", INFERQ_GATEWAY_WEBHOOK_CLAIM_IDLE_S="2",
                    **{f"INFERQ_GATEWAY_{k.upper()}": v for k, v in env.items()})
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen([sys.executable, "-m", "inferq.producer.gateway", "--host", "127.0.0.1",
                                      "--port", str(self.port), "--log-level", "warning"],
                                     cwd=REPO, env=full, stdout=self._log, stderr=subprocess.STDOUT)
        wait_for(self._up, 60, "the gateway to listen")

    def _up(self) -> bool:
        assert self.proc.poll() is None, self.log_path.read_text()[-3000:]
        try:
            urllib.request.urlopen(self.base + "/health", timeout=1)
            return True
        except OSError as e:
            return getattr(e, "code", None) == 503  # listening, no worker yet

    def client(self, key: str = "unused") -> openai.OpenAI:
        return openai.OpenAI(base_url=self.base + "/v1", api_key=key, max_retries=0)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.kill()


def outbox_empty(r: redis.Redis) -> bool:
    return all(r.zcard(keys.webhook_outbox(t)) == 0 and r.xlen(keys.completion_events(t)) == 0
               for t in keys.all_tags())


def dead_letters(r: redis.Redis, tenant: str) -> list[dict]:
    rows = [json.loads(x) for t in keys.all_tags() for x in r.lrange(keys.webhook_dead(t), 0, -1)]
    return [x for x in rows if x["tenant"] == tenant]


def test_a_thousand_jobs_every_event_delivered_verified_through_receiver_outage_and_gateway_kill(stack, tmp_path):
    r = redis.Redis.from_url(stack.url)
    tenant = f"acme-{time.time_ns()}"
    # Attempts never run out here, however long the outage lasts on a slow machine.
    g1 = Gateway(tmp_path, stack.url, api_keys=f"k-acme:{tenant}", webhook_max_attempts="100000")
    receiver = None
    g2 = None
    try:
        receiver = Receiver(tmp_path)
        receiver.holding = True  # deliveries are logged, never answered: g1 dies in the middle of them
        receiver.start()
        ep = g1.client("k-acme").webhooks.create(
            url=receiver.url, name="receiver",
            event_types=["job.completed", "response.completed", "response.incomplete"])
        assert ep.signing_secret.startswith("whsec_")
        receiver.secret_file.write_text(ep.signing_secret)

        producer = Producer(stack.url, default_model=TINY)
        jobs: list[tuple[str, bool]] = []

        def submit(n: int) -> None:
            for i in range(n):
                responses = len(jobs) % 2 == 0
                h = producer.submit(f"hi {len(jobs)}", tenant=tenant, sampling={"max_tokens": 1},
                                    metadata={"route": "responses"} if responses else {})
                jobs.append((h.id, responses))

        def ended() -> int:
            return sum(1 for jid, _ in jobs if r.hget(keys.job_info(jid), "status") in (b"done", b"error"))

        submit(300)
        held = wait_for(lambda: (lambda xs: xs if len(xs) >= 20 else None)(receiver.received()), 120,
                        "deliveries in flight")
        g1.kill()  # with deliveries received but unanswered, records read and deliveries leased
        receiver.stop()  # and the endpoint down: deliveries fail and are retried
        receiver.holding = False
        submit(300)
        g2 = Gateway(tmp_path, stack.url, api_keys=f"k-acme:{tenant}", webhook_max_attempts="100000")
        wait_for(lambda: ended() >= 550, 180, "jobs to end with the new gateway")
        submit(400)
        receiver.start()
        wait_for(lambda: ended() == len(jobs), 180, "every job to end")

        expected = {jid for jid, _ in jobs} | {"resp_" + jid for jid, resp in jobs if resp}
        held_ids = [x["webhook_id"] for x in held]

        def all_arrived() -> bool:
            # every event, and again each delivery g1 died holding (its first copy counts as received,
            # so the retry, on back-off after the outage, must be waited for too)
            xs = receiver.received()
            seen_ids = [x["webhook_id"] for x in xs]
            return {x["data_id"] for x in xs} >= expected and all(seen_ids.count(h) >= 2 for h in held_ids)

        wait_for(all_arrived, 300, "every event at the receiver, and the held deliveries again")
        got = receiver.received()
        assert {x["data_id"] for x in got} == expected  # nothing another tenant's, nothing unsubscribed
        # One webhook-id per event whatever the retries and crashes; a duplicate is byte-identical.
        by_event: dict[str, set] = {}
        bodies: dict[str, set] = {}
        for x in got:
            by_event.setdefault(x["id"], set()).add(x["webhook_id"])
            bodies.setdefault(x["webhook_id"], set()).add(x["body"])
            assert x["id"] == event_id(x["type"], x["data_id"])
            assert x["type"] in ("job.completed", "response.completed", "response.incomplete")
            assert x["type"].startswith("response.") == x["data_id"].startswith("resp_")
        assert len(by_event) == len(expected)
        assert all(len(ids) == 1 for ids in by_event.values())
        assert all(len(b) == 1 for b in bodies.values())
        # The deliveries g1 died in the middle of were sent again by g2, under the same webhook-id.
        seen = [x["webhook_id"] for x in got]
        assert dead_letters(r, tenant) == []
        assert all(seen.count(x["webhook_id"]) >= 2 for x in held)
        duplicates = len(got) - len(by_event)
        print(f"\n{len(jobs)} jobs, {len(by_event)} events, {len(got)} deliveries ({duplicates} duplicates)")
        wait_for(lambda: outbox_empty(r), 60, "the outbox to drain")
        assert dead_letters(r, tenant) == []
    finally:
        for proc in (receiver, g2):
            if proc is not None:
                proc.stop()
        g1.kill()
        r.close()

