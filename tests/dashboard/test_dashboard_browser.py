"""The dashboard in a real headless browser against real processes: redis-server,
worker processes on a tiny random Llama (paced with --step-pace-s so work is
surely still under way while the page is read), and the gateway.

One story, in order (each worker start costs seconds, so they are shared):
a backlog appears on the queues table and drains; a job whose worker is killed
mid-run shows two attempts on its page (the first superseded, the second done
on another worker); a job dead-lettered after its worker died is retried from
the page and completes; a batch's progress moves on the page until it
completes. Every wait is on what the page shows, never on time; the timeouts
are only upper bounds. Screenshots go to the artefacts directory
(INFERQ_TEST_ARTIFACTS, else the test's tmp dir).
"""
from __future__ import annotations

import io
import json
import time

import httpx
import pytest
import redis
from openai import OpenAI

from inferq.schemas import keys
from tests.conftest import RedisServer, free_port
from tests.dashboard.browser import artifacts_dir, start_browser
from tests.gateway.stack import running_gateway
from tests.workers import WorkerProc

MODEL = "dash"
OPERATOR = "op-key"
WAIT = 180  # upper bound of every wait (a loaded CI machine); each ends as soon as the page shows it


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from tests.tiny_models import save_tiny_model

    return save_tiny_model("llama", tmp_path_factory.mktemp("tiny") / "llama")


class Story:
    def __init__(self, tmp, tiny):
        self.tmp, self.tiny = tmp, tiny
        self.redis = RedisServer(tmp).start()
        self.r = redis.Redis.from_url(self.redis.url)
        self.ports = {w: free_port() for w in ("wa", "wb", "wc")}
        self.procs: list[WorkerProc] = []

    def worker(self, wid: str, *extra: str) -> WorkerProc:
        # Paced: >= 0.1 s a step, so a job of N tokens runs >= N/10 s on any machine.
        w = WorkerProc(self.redis.url, self.tiny, MODEL, self.tmp, wid, "--step-pace-s", "0.1",
                       "--metrics-port", str(self.ports[wid]), *extra)
        self.procs.append(w)
        return w.wait_ready(WAIT)

    def metrics_urls(self) -> str:
        return ",".join(f"http://127.0.0.1:{p}/metrics" for p in self.ports.values())

    def info(self, job_id: str) -> dict:
        return {k.decode(): v.decode() for k, v in self.r.hgetall(keys.job_info(job_id)).items()}

    def close(self):
        for w in self.procs:
            w.kill()
            w.terminate()
        self.r.close()
        self.redis.stop()


def wait_for(pred, what: str, timeout: float = WAIT):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        got = pred()
        if got:
            return got
        time.sleep(0.2)
    raise TimeoutError(f"never saw: {what}")


def cells(driver, table_id: str) -> list[list[str]]:
    """The table's cells as text, read in one script call: the page re-renders
    its tables every refresh, so element handles would go stale between calls."""
    return driver.execute_script(
        "return [...document.querySelectorAll(`#${arguments[0]} tbody tr`)]"
        ".map(tr => [...tr.cells].map(td => td.innerText.trim()))", table_id)


def text_of(driver, element_id: str) -> str:
    return driver.execute_script("const e = document.getElementById(arguments[0]); return e ? e.innerText : ''",
                                 element_id)


def click_button(driver, cls: str, job_id: str) -> bool:
    """Click the page's own button (its click handler runs) for one job's row."""
    return driver.execute_script(
        "const b = [...document.querySelectorAll('.' + arguments[0])].find(b => b.dataset.job === arguments[1]);"
        "if (!b) return false; b.click(); return true;", cls, job_id)


def queue_row(driver) -> list[str] | None:
    return next((r for r in cells(driver, "queue-table") if r and r[0] == MODEL), None)


def submit(url: str, prompt: str, max_tokens: int) -> str:
    body = {"model": MODEL, "prompt": prompt, "sampling": {"max_tokens": max_tokens, "ignore_eos": True}}
    r = httpx.post(f"{url}/v1/jobs", json=body, headers={"Authorization": f"Bearer {OPERATOR}"}, timeout=30)
    assert r.status_code == 202, r.text
    return r.json()["id"]


def save_json(url: str, path: str, to) -> dict:
    """A view's answer as an artefact (docs/dashboard.md's examples come from these)."""
    body = httpx.get(f"{url}{path}", headers={"Authorization": f"Bearer {OPERATOR}"}, timeout=10).json()
    to.write_text(json.dumps(body, indent=2))
    return body


def test_dashboard_in_a_browser(tiny, tmp_path):
    from selenium.webdriver.common.by import By

    story = Story(tmp_path, tiny)
    shots = artifacts_dir(tmp_path)
    driver = None
    try:
        story.worker("wa", "--max-num-seqs", "2")
        with running_gateway(story.redis.url, api_keys=f"{OPERATOR}", dashboard_keys=OPERATOR,
                             dashboard_worker_metrics=story.metrics_urls(), dashboard_sample_s=0.5,
                             files_dir=str(tmp_path / "files"), batch_max_in_flight=2) as url:
            driver = start_browser(tmp_path)
            driver.get(f"{url}/dashboard")
            assert "log in" in driver.find_element(By.ID, "login-message").text.lower()
            driver.find_element(By.ID, "login-key").send_keys(OPERATOR)
            driver.find_element(By.ID, "login-submit").click()
            wait_for(lambda: text_of(driver, "who") == "operator", "logged in as operator")

            # 1. A backlog appears and drains: 10 jobs of 24 tokens, 2 at a time.
            jobs = [submit(url, f"backlog {i}", 24) for i in range(10)]
            row = wait_for(lambda: (r := queue_row(driver)) and int(r[1]) > 0 and r, "jobs waiting on the page")
            assert int(row[1]) + int(row[2]) >= 2
            wait_for(lambda: any(r[0] == "wa" and "alive" in r[2] and r[5] != "-" for r in cells(driver, "worker-table")),
                     "worker wa with its KV usage")
            driver.save_screenshot(str(shots / "backlog.png"))
            save_json(url, "/dashboard/api/queues", shots / "queues.json")
            save_json(url, "/dashboard/api/workers", shots / "workers.json")
            wait_for(lambda: all(story.info(j).get("status") == "done" for j in jobs), "the backlog done")
            wait_for(lambda: (r := queue_row(driver)) and r[1] == "0" and r[2] == "0", "the backlog drained on the page")
            workers = cells(driver, "worker-table")
            wa = next(r for r in workers if r[0] == "wa")
            assert wa[7] and wa[7] != "-" and "no metrics URL" not in wa[7], wa  # the doctor's verdict
            series = httpx.get(f"{url}/dashboard/api/series", headers={"Authorization": f"Bearer {OPERATOR}"},
                               timeout=10).json()["data"]
            assert max(p["waiting"] for p in series) > 0 and max(p["tokens_per_s"] for p in series) > 0
            assert any(p["ttft_p50_s"] is not None for p in series)
            driver.save_screenshot(str(shots / "drained.png"))

            # 2. Two attempts: the worker running a job is killed; another takes it over.
            j1 = submit(url, "survive a crash", 60)
            wait_for(lambda: story.info(j1).get("status") == "running", "j1 running on wa")
            story.procs[0].kill()
            story.worker("wb", "--max-num-seqs", "2")
            driver.get(f"{url}/dashboard#job={j1}")
            wait_for(lambda: text_of(driver, "job-status") == "done", "j1 done on its page")
            attempts = cells(driver, "job-attempts")
            assert [(a[0], a[1], a[5]) for a in attempts] == [("1", "wa", "superseded"), ("2", "wb", "done")]
            kinds = driver.execute_script("return [...document.querySelectorAll('#job-timeline li')]"
                                          ".map(li => li.dataset.type + li.dataset.attempt)")
            assert kinds[0] == "queued0" and {"started1", "started2", "first_token2", "done2"} <= set(kinds)
            assert text_of(driver, "job-text").strip()
            driver.save_screenshot(str(shots / "job-two-attempts.png"))
            save_json(url, f"/dashboard/api/jobs/{j1}", shots / "job.json")
            save_json(url, "/dashboard/api/series", shots / "series.json")

            # 3. DLQ: a job whose worker dies, taken by a worker allowing one delivery,
            # is dead-lettered; retried from the page, it completes.
            j2 = submit(url, "dead letter me", 60)
            wait_for(lambda: story.info(j2).get("status") == "running", "j2 running on wb")
            story.procs[1].kill()
            story.worker("wc", "--max-num-seqs", "1", "--max-deliveries", "1")
            driver.get(f"{url}/dashboard#dlq")
            dead = wait_for(lambda: next((r for r in cells(driver, "dlq-table") if r[2] == j2), None),
                            "j2 in the DLQ table")
            assert dead[3] == "max_deliveries", dead
            driver.save_screenshot(str(shots / "dlq.png"))
            save_json(url, "/dashboard/api/dlq", shots / "dlq.json")
            assert click_button(driver, "dlq-retry", j2)
            wait_for(lambda: not any(r[2] == j2 for r in cells(driver, "dlq-table")), "j2 gone from the DLQ table")
            driver.get(f"{url}/dashboard#job={j2}")
            wait_for(lambda: text_of(driver, "job-status") == "done", "j2 done after the retry")

            # 4. A batch's progress: 6 lines, one at a time on wc (>= 1.6 s each).
            client = OpenAI(base_url=f"{url}/v1", api_key=OPERATOR, max_retries=0)
            lines = "\n".join(json.dumps({"custom_id": f"r{i}", "method": "POST", "url": "/v1/completions",
                                          "body": {"model": MODEL, "prompt": f"line {i}", "max_tokens": 16,
                                                   "ignore_eos": True}}) for i in range(6))
            f = client.files.create(file=("b.jsonl", io.BytesIO(lines.encode())), purpose="batch")
            batch = client.batches.create(input_file_id=f.id, endpoint="/v1/completions", completion_window="24h").id
            driver.get(f"{url}/dashboard#batches")

            def batch_row():
                return next((r for r in cells(driver, "batch-table") if r and r[0] == batch), None)

            mid = wait_for(lambda: (r := batch_row()) and r[1] == "in_progress" and 0 < int(r[3]) < 6 and r,
                           "the batch part done")
            assert mid[5] == "6"
            driver.save_screenshot(str(shots / "batch-progress.png"))
            save_json(url, "/dashboard/api/batches", shots / "batches.json")
            done = wait_for(lambda: (r := batch_row()) and r[1] == "completed" and r, "the batch completed")
            assert done[3] == "6" and done[4] == "0"
            driver.get(f"{url}/dashboard")
            wait_for(lambda: queue_row(driver) is not None, "the queues table again")
            driver.save_screenshot(str(shots / "overview.png"))
    finally:
        if driver is not None:
            driver.quit()
        story.close()
