"""Metric label sets stay bounded whatever callers send: routes are templates,
methods come from an allow-list, so junk requests cannot mint new series."""
import random

import httpx

from tests.gateway.stack import running_gateway

BOUND = 60  # inferq_gateway_requests_total series after thousands of junk requests


def series(text: str, name: str) -> set[str]:
    return {line.rsplit(" ", 1)[0] for line in text.splitlines() if line.startswith(name + "{")}


def junk_requests(rng: random.Random, n: int):
    words = ["v1", "jobs", "models", "events", "x", "..", "%2e", "admin", "chat", "completions"]
    methods = ["GET", "POST", "DELETE", "PUT", "PATCH", "OPTIONS", "BREW", "PROPFIND", "X-" + "A" * 20]
    for i in range(n):
        path = "/" + "/".join(rng.choice(words) + (str(rng.randrange(10**6)) if rng.random() < 0.5 else "")
                              for _ in range(rng.randint(1, 5)))
        if i % 3 == 0:
            path = f"/v1/jobs/{rng.randrange(10**9)}" + rng.choice(["", "/events", "/junk", f"/{i}/x"])
        yield rng.choice(methods), path


def test_junk_requests_do_not_grow_the_label_set(redis_url):
    rng = random.Random(7)
    with running_gateway(redis_url) as url, httpx.Client(base_url=url, timeout=30) as c:
        for method, path in junk_requests(rng, 300):
            c.request(method, path)
        after_300 = series(c.get("/metrics").text, "inferq_gateway_requests_total")
        for method, path in junk_requests(rng, 2000):
            c.request(method, path)
        text = c.get("/metrics").text
    after_2300 = series(text, "inferq_gateway_requests_total")
    durations = series(text, "inferq_gateway_request_duration_seconds_count")
    assert len(after_2300) <= BOUND, sorted(after_2300)
    assert len(after_2300 - after_300) < 20  # saturated: 2000 more junk requests add (almost) nothing
    assert all('method="BREW"' not in s and "PROPFIND" not in s for s in after_2300)
    assert {s.split('route="')[1].split('"')[0] for s in durations} <= {
        "other", "/v1/jobs/{id}", "/v1/jobs/{id}/events", "/metrics", "/v1/models/{model}", "/v1/models",
        "/v1/jobs", "/v1/completions", "/v1/chat/completions", "/health", "/ready"}
    print(f"\n[metrics] {len(after_2300)} request series after 2300 junk requests (bound {BOUND})")


def test_queue_numbers_per_class_and_tenant_with_a_bounded_tenant_label(redis_url):
    """Per priority class and per fair-share tenant lane; tenants named only if a
    configured API key maps to them, every other tenant counts as "other"."""
    from inferq.producer import Producer

    p = Producer(redis_url, default_model="metric-lanes", fair_share=True)
    for i in range(3):
        p.submit(prompt_token_ids=[1, i + 1], tenant="acme")
    for i in range(2):
        p.submit(prompt_token_ids=[2, i + 1], tenant="acme", priority_class="batch")
    for i in range(50):  # callers of the SDK may name any tenant: no new series for them
        p.submit(prompt_token_ids=[3, i + 1], tenant=f"made-up-{i}")
    p.close()
    with running_gateway(redis_url, api_keys="k1:acme") as url, httpx.Client(base_url=url, timeout=30) as c:
        text = c.get("/metrics", headers={"Authorization": "Bearer k1"}).text
    rows = {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
            if line.startswith("inferq_queue_") and 'model="metric-lanes"' in line}
    assert rows['inferq_queue_class_waiting{class="interactive",model="metric-lanes"}'] == 53
    assert rows['inferq_queue_class_waiting{class="batch",model="metric-lanes"}'] == 2
    assert rows['inferq_queue_tenant_waiting{model="metric-lanes",tenant="acme"}'] == 5
    assert rows['inferq_queue_tenant_waiting{model="metric-lanes",tenant="other"}'] == 50
    tenants = {k.split('tenant="')[1].split('"')[0] for k in rows if "tenant=" in k}
    assert tenants == {"acme", "other"}
