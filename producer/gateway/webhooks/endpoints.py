"""Webhook endpoints: where a tenant's events go, and the secret each is signed with.

Two sources, read together: the operator's (``INFERQ_GATEWAY_WEBHOOKS``, JSON or
``@/path/to/file.json``: ``{"tenant": [{"url", "secret", "events"}]}``; the
tenant ``"*"`` receives every tenant's events) and the tenants' own, registered
through ``/v1/webhook_endpoints`` and kept in one Redis hash
(``keys.webhook_endpoints()``). A secret is ``whsec_`` + base64 of 32 random
bytes; Redis holds it because every delivery is signed with it.
"""
from __future__ import annotations

import base64
import hashlib
import json
import secrets
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Optional
from urllib.parse import urlsplit

from inferq.schemas import keys
from inferq.schemas.completion_events import EVENT_TYPES
from inferq.schemas.text import as_str

EVERY_TENANT = "*"


@dataclass(frozen=True)
class Endpoint:
    id: str
    tenant: str
    url: str
    secret: str
    events: tuple[str, ...]  # subscribed types; empty: every type
    name: str = ""
    created_at: int = 0
    updated_at: int = 0
    source: str = "api"  # "api" | "config"

    def wants(self, tenant: str, event_type: str) -> bool:
        return (self.tenant in (tenant, EVERY_TENANT)) and (not self.events or event_type in self.events)

    def public(self, with_secret: bool = False) -> dict:
        """The endpoint as the API shows it (OpenAI's ``webhook_endpoint`` object)."""
        out = {"id": self.id, "object": "webhook_endpoint", "url": self.url, "name": self.name,
               "event_types": list(self.events or EVENT_TYPES), "created_at": self.created_at,
               "updated_at": self.updated_at or self.created_at, "signing_secret_hint": hint(self.secret)}
        if with_secret:
            out["signing_secret"] = self.secret
        return out


def new_secret() -> str:
    return "whsec_" + base64.b64encode(secrets.token_bytes(32)).decode()


def hint(secret: str) -> str:
    return "whsec_..." + secret[-4:]


def check_secret(secret: str) -> str:
    """A Standard Webhooks secret: ``whsec_`` + base64 of at least 16 bytes."""
    if not isinstance(secret, str) or not secret.startswith("whsec_"):
        raise ValueError("a webhook secret starts with 'whsec_' followed by base64")
    try:
        raw = base64.b64decode(secret[6:], validate=True)
    except ValueError:
        raise ValueError("a webhook secret's part after 'whsec_' must be base64") from None
    if len(raw) < 16:
        raise ValueError("a webhook secret must carry at least 16 bytes")
    return secret


def check_url(url: str, allow_http: bool) -> str:
    if not isinstance(url, str) or len(url) > 2048:
        raise ValueError("url must be a string of at most 2048 characters")
    parts = urlsplit(url)
    schemes = ("https", "http") if allow_http else ("https",)
    if parts.scheme not in schemes or not parts.hostname:
        raise ValueError(f"url must be an absolute {' or '.join(schemes)} URL")
    return url


def check_events(events) -> tuple[str, ...]:
    if events is None:
        return ()
    if not isinstance(events, list) or not all(isinstance(e, str) for e in events):
        raise ValueError("event_types must be a list of strings")
    unknown = sorted(set(events) - set(EVENT_TYPES))
    if unknown:
        raise ValueError(f"unknown event types {unknown}; known: {', '.join(EVENT_TYPES)}")
    return tuple(dict.fromkeys(events))


def parse_config(raw: str) -> list[Endpoint]:
    """The operator's endpoints from INFERQ_GATEWAY_WEBHOOKS (JSON, or ``@file``)."""
    raw = (raw or "").strip()
    if not raw:
        return []
    if raw.startswith("@"):
        raw = Path(raw[1:]).read_text()
    try:
        spec = json.loads(raw)
    except ValueError as e:
        raise ValueError(f"INFERQ_GATEWAY_WEBHOOKS is not JSON: {e}") from None
    if not isinstance(spec, dict):
        raise ValueError('INFERQ_GATEWAY_WEBHOOKS must map tenants to lists of {"url", "secret", "events"}')
    out = []
    for tenant, items in spec.items():
        for item in items if isinstance(items, list) else [items]:
            try:
                url = check_url(item["url"], allow_http=True)
                secret = check_secret(item["secret"])
                events = check_events(item.get("events"))
            except (KeyError, TypeError, ValueError) as e:
                raise ValueError(f"INFERQ_GATEWAY_WEBHOOKS, tenant {tenant!r}: {e}") from None
            # A stable id: deliveries already in the outbox find their endpoint after a restart.
            eid = "we_cfg_" + hashlib.sha256(f"{tenant}|{url}".encode()).hexdigest()[:20]
            out.append(Endpoint(id=eid, tenant=tenant, url=url, secret=secret, events=events,
                                name=item.get("name", ""), source="config"))
    return out


class EndpointStore:
    """Operator endpoints (fixed) plus registered ones (Redis), with a short cache
    for the dispatcher, which looks endpoints up for every event."""

    def __init__(self, redis, configured: list[Endpoint], cache_s: float = 1.0):
        self.redis = redis
        self.configured = list(configured)
        self.cache_s = cache_s
        self._cache: Optional[dict[str, Endpoint]] = None
        self._cached_at = 0.0

    async def all(self, fresh: bool = False) -> dict[str, Endpoint]:
        if fresh or self._cache is None or time.monotonic() - self._cached_at > self.cache_s:
            raw = await self.redis.hgetall(keys.webhook_endpoints())
            found = {e.id: e for e in self.configured}
            for k, v in raw.items():
                d = json.loads(as_str(v))
                d["events"] = tuple(d.get("events") or ())
                found[as_str(k)] = Endpoint(**d)
            self._cache, self._cached_at = found, time.monotonic()
        return self._cache

    async def matching(self, tenant: str, event_type: str) -> list[Endpoint]:
        return [e for e in (await self.all()).values() if e.wants(tenant, event_type)]

    async def of_tenant(self, tenant: Optional[str]) -> list[Endpoint]:
        """A tenant's endpoints (None: every endpoint), oldest first."""
        found = (await self.all(fresh=True)).values()
        return sorted((e for e in found if tenant is None or e.tenant == tenant), key=lambda e: (e.created_at, e.id))

    async def create(self, tenant: str, url: str, events: tuple[str, ...], name: str) -> Endpoint:
        now = int(time.time())
        ep = Endpoint(id="we_" + secrets.token_hex(12), tenant=tenant, url=url, secret=new_secret(), events=events,
                      name=name, created_at=now, updated_at=now)
        await self._save(ep)
        return ep

    async def replace(self, ep: Endpoint) -> None:
        await self._save(ep)

    async def delete(self, endpoint_id: str) -> bool:
        found = bool(await self.redis.hdel(keys.webhook_endpoints(), endpoint_id))
        self._cache = None
        return found

    async def _save(self, ep: Endpoint) -> None:
        d = asdict(ep)
        d["events"] = list(ep.events)
        await self.redis.hset(keys.webhook_endpoints(), ep.id, json.dumps(d))
        self._cache = None
