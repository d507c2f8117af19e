"""API keys (bearer) and tenants: 401 without a valid key, and a tenant can
neither read nor cancel another tenant's job."""
import httpx
import openai
import pytest
from openai import OpenAI

from tests.gateway.stack import TINY, running_gateway


@pytest.fixture(scope="module")
def keyed_url(stack):
    with running_gateway(stack.url, api_keys="alice-key:alice,bob-key:bob,admin-key") as url:
        yield url


def auth(key):
    return {"Authorization": f"Bearer {key}"}


def test_missing_or_wrong_key_is_401(keyed_url):
    body = {"model": TINY, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    for headers in ({}, auth("wrong"), {"Authorization": "Basic alice-key"}):
        r = httpx.post(f"{keyed_url}/v1/chat/completions", json=body, headers=headers, timeout=10)
        assert r.status_code == 401
        assert r.json()["error"]["code"] == "invalid_api_key"
        assert r.headers["www-authenticate"] == "Bearer"
    assert httpx.get(f"{keyed_url}/v1/models", timeout=10).status_code == 401
    # Health and metrics stay open for load balancers and Prometheus.
    assert httpx.get(f"{keyed_url}/health", timeout=10).status_code == 200


def test_openai_client_with_key(keyed_url):
    good = OpenAI(base_url=f"{keyed_url}/v1", api_key="alice-key", max_retries=0)
    r = good.chat.completions.create(model=TINY, messages=[{"role": "user", "content": "hi"}], max_tokens=3)
    assert r.choices[0].message.content is not None
    bad = OpenAI(base_url=f"{keyed_url}/v1", api_key="nope", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()


def test_tenant_isolation(keyed_url):
    body = {"model": TINY, "prompt": "mine", "sampling": {"max_tokens": 2}}
    job = httpx.post(f"{keyed_url}/v1/jobs", json=body, headers=auth("alice-key"), timeout=30).json()["id"]
    assert httpx.get(f"{keyed_url}/v1/jobs/{job}", headers=auth("alice-key"), timeout=10).status_code == 200
    for method, path in (("GET", f"/v1/jobs/{job}"), ("DELETE", f"/v1/jobs/{job}"),
                         ("GET", f"/v1/jobs/{job}/events")):
        r = httpx.request(method, f"{keyed_url}{path}", headers=auth("bob-key"), timeout=10)
        assert r.status_code == 404, (method, path)
    # A key without a tenant is unrestricted (operators).
    assert httpx.get(f"{keyed_url}/v1/jobs/{job}", headers=auth("admin-key"), timeout=10).status_code == 200
