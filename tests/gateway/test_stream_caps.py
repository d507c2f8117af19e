"""Concurrent reply-stream readers are capped per tenant and in total (429
too_many_streams with Retry-After), and a slot comes back when its stream ends.
Job-events streams of hand-made, never-ending jobs keep the slots busy, so
nothing here depends on how fast a worker generates."""
import threading
import time
import uuid

import httpx
import pytest
import redis

from inferq.schemas import StartedEvent, encode_event, keys
from tests.gateway.stack import running_gateway

KEYS = "k-acme:acme,k-beta:beta"


def open_job(r, tenant: str) -> str:
    job_id = uuid.uuid4().hex
    r.hset(keys.job_info(job_id), mapping={"status": "running", "model": "m", "tenant": tenant, "attempt": 1})
    r.xadd(keys.reply(job_id), encode_event(StartedEvent(attempt=1, seq=0)))
    return job_id


class Listener:
    """An events stream held open in a thread until closed."""

    def __init__(self, url: str, key: str, job_id: str):
        self.status = None
        self._stop = threading.Event()
        self._started = threading.Event()
        self._t = threading.Thread(target=self._run, args=(url, key, job_id), daemon=True)
        self._t.start()
        assert self._started.wait(30), "stream did not open"

    def _run(self, url, key, job_id):
        with httpx.stream("GET", f"{url}/v1/jobs/{job_id}/events", timeout=60,
                          headers={"Authorization": f"Bearer {key}"}) as resp:
            self.status = resp.status_code
            self._started.set()
            for _ in resp.iter_lines():
                if self._stop.is_set():
                    break

    def close(self):
        self._stop.set()
        self._t.join(30)


def status_of(url: str, key: str, job_id: str) -> int:
    with httpx.stream("GET", f"{url}/v1/jobs/{job_id}/events", timeout=30,
                      headers={"Authorization": f"Bearer {key}"}) as resp:
        if resp.status_code == 429:
            assert resp.headers["retry-after"] and "too_many_streams" in resp.read().decode()
        return resp.status_code


@pytest.fixture
def r(redis_url):
    c = redis.Redis.from_url(redis_url)
    yield c
    c.close()


def test_streams_are_capped_per_tenant_and_in_total(redis_url, r):
    with running_gateway(redis_url, api_keys=KEYS, max_streams=3, max_streams_per_tenant=2) as url:
        acme = [Listener(url, "k-acme", open_job(r, "acme")) for _ in range(2)]
        assert [a.status for a in acme] == [200, 200]
        assert status_of(url, "k-acme", open_job(r, "acme")) == 429  # acme's own cap
        beta = Listener(url, "k-beta", open_job(r, "beta"))
        assert beta.status == 200  # another tenant is not starved by acme
        assert status_of(url, "k-beta", open_job(r, "beta")) == 429  # the total cap
        acme[0].close()
        end = time.monotonic() + 30
        while status_of(url, "k-acme", open_job(r, "acme")) == 429:  # wait for the slot to come back
            assert time.monotonic() < end, "a closed stream's slot never came back"
            time.sleep(0.1)
        acme[1].close()
        beta.close()
