"""Who may call the dashboard: every route (found from the app itself, so a new
one is covered too) refuses a caller without a key and one with a wrong key;
a tenant key gets 403 on the operator views and 404 for another tenant's job
and batch; a cookie login works for a browser, and a cookie alone cannot
change anything without the dashboard's own header (no cross-site forms)."""
import io
import json
import re

import httpx
import pytest
from openai import OpenAI

from tests.gateway.stack import TINY, running_gateway

OPERATOR = "op-key"


@pytest.fixture(scope="module")
def url(stack, tmp_path_factory):
    with running_gateway(stack.url, api_keys="acme-key:acme,beta-key:beta,all-key", dashboard_keys=OPERATOR,
                         files_dir=str(tmp_path_factory.mktemp("files"))) as u:
        yield u


def auth(key):
    return {"Authorization": f"Bearer {key}"}


@pytest.fixture(scope="module")
def acme(url):
    """A job and a batch of tenant acme."""
    job = httpx.post(f"{url}/v1/jobs", json={"model": TINY, "prompt": "mine", "sampling": {"max_tokens": 2}},
                     headers=auth("acme-key"), timeout=30).json()["id"]
    client = OpenAI(base_url=f"{url}/v1", api_key="acme-key", max_retries=0)
    line = json.dumps({"custom_id": "a", "method": "POST", "url": "/v1/completions",
                       "body": {"model": TINY, "prompt": "x", "max_tokens": 2}})
    f = client.files.create(file=("a.jsonl", io.BytesIO(line.encode() + b"\n")), purpose="batch")
    batch = client.batches.create(input_file_id=f.id, endpoint="/v1/completions", completion_window="24h").id
    return {"job_id": job, "batch_id": batch, "model": TINY, "partition": "0", "dlq_id": "1-0"}


def dashboard_routes(url):
    """(method, path template) of every dashboard route the app serves."""
    from inferq.producer.gateway import dashboard

    out = []
    for part in dashboard.PARTS:
        for route in part.router.routes:
            for method in sorted(route.methods - {"HEAD"}):
                out.append((method, route.path))
    assert len(out) >= 12
    return out


def concrete(path, values):
    return re.sub(r"\{(\w+)\}", lambda m: values[m.group(1)], path)


PUBLIC = {("GET", "/dashboard/login"), ("POST", "/dashboard/login"), ("POST", "/dashboard/logout"),
          ("GET", "/dashboard/static/{name}")}  # a way in, a way out, and the page's code: no data


def test_every_route_refuses_no_key_and_a_wrong_key(url, acme):
    values = {**acme, "name": "dashboard.js"}
    checked = 0
    for method, path in dashboard_routes(url):
        if (method, path) in PUBLIC:
            continue
        for headers in ({}, auth("wrong-key"), {"Authorization": f"Basic {OPERATOR}"}):
            r = httpx.request(method, f"{url}{concrete(path, values)}", headers=headers, timeout=10)
            assert r.status_code in (401, 403), (method, path, headers, r.status_code, r.text[:200])
        # A wrong key in the cookie is refused the same.
        r = httpx.request(method, f"{url}{concrete(path, values)}", cookies={"inferq_dashboard": "wrong-key"},
                          headers={"X-Inferq-Dashboard": "1"}, timeout=10)
        assert r.status_code == 401, (method, path, r.status_code)
        checked += 1
    assert checked >= 9
    page = httpx.get(f"{url}/dashboard", timeout=10)
    assert page.status_code == 401 and 'name="key"' in page.text  # the login form, nothing else


def test_tenant_keys_get_no_operator_views_and_no_other_tenants_data(url, acme):
    for path in ("/dashboard/api/queues", "/dashboard/api/workers", "/dashboard/api/series", "/dashboard/api/dlq"):
        r = httpx.get(f"{url}{path}", headers=auth("acme-key"), timeout=10)
        assert r.status_code == 403 and r.json()["error"]["code"] == "operator_only", path
    for method, path in (("POST", "/dashboard/api/dlq/{model}/{partition}/{dlq_id}/retry"),
                         ("DELETE", "/dashboard/api/dlq/{model}/{partition}/{dlq_id}")):
        assert httpx.request(method, f"{url}{concrete(path, acme)}", headers=auth("acme-key"),
                             timeout=10).status_code == 403
    # Another tenant: acme's job and batch do not exist for beta.
    job, batch = acme["job_id"], acme["batch_id"]
    assert httpx.get(f"{url}/dashboard/api/jobs/{job}", headers=auth("beta-key"), timeout=10).status_code == 404
    assert httpx.post(f"{url}/dashboard/api/batches/{batch}/cancel", headers=auth("beta-key"),
                      timeout=10).status_code == 404
    listed = httpx.get(f"{url}/dashboard/api/batches", headers=auth("beta-key"), timeout=10).json()["data"]
    assert batch not in [b["id"] for b in listed]
    # acme itself, and the operator, see them.
    for key in ("acme-key", OPERATOR):
        r = httpx.get(f"{url}/dashboard/api/jobs/{job}", headers=auth(key), timeout=10)
        assert r.status_code == 200 and r.json()["id"] == job
        listed = httpx.get(f"{url}/dashboard/api/batches", headers=auth(key), timeout=10).json()["data"]
        assert batch in [b["id"] for b in listed]
    assert httpx.get(f"{url}/dashboard/api/whoami", headers=auth("acme-key"), timeout=10).json() == \
        {"operator": False, "tenant": "acme"}
    # An API key without a tenant is unrestricted on jobs, but not an operator.
    assert httpx.get(f"{url}/dashboard/api/queues", headers=auth("all-key"), timeout=10).status_code == 403


def test_cookie_login_and_the_change_header(url, acme):
    with httpx.Client(base_url=url, timeout=10) as browser:
        assert browser.post("/dashboard/login", data={"key": "nope"}).status_code == 401
        r = browser.post("/dashboard/login", data={"key": OPERATOR})
        assert r.status_code == 303 and "httponly" in r.headers["set-cookie"].lower()
        assert "samesite=strict" in r.headers["set-cookie"].lower()
        page = browser.get("/dashboard")
        assert page.status_code == 200 and "dashboard.js" in page.text
        assert browser.get("/dashboard/api/queues").status_code == 200
        # A change with the cookie but without the header (what another site's form sends) is refused.
        r = browser.delete(f"/dashboard/api/dlq/{TINY}/0/1-0")
        assert r.status_code == 403 and r.json()["error"]["code"] == "csrf"
        r = browser.delete(f"/dashboard/api/dlq/{TINY}/0/1-0", headers={"X-Inferq-Dashboard": "1"})
        assert r.status_code == 404  # allowed through; there is no such entry
        browser.post("/dashboard/logout")
        assert browser.get("/dashboard/api/queues").status_code == 401


def test_an_exposed_gateway_without_operator_keys_serves_no_operator_view(stack):
    with running_gateway(stack.url, api_keys="k", published_on="10.0.0.5") as u:
        for key in ("k", "other"):
            r = httpx.get(f"{u}/dashboard/api/queues", headers=auth(key), timeout=10)
            assert r.status_code in (401, 403)
        assert httpx.get(f"{u}/dashboard/api/queues", headers=auth("k"), timeout=10).status_code == 403


def test_dashboard_off(stack):
    with running_gateway(stack.url, dashboard=False) as u:
        assert httpx.get(f"{u}/dashboard/api/queues", timeout=10).status_code == 404
