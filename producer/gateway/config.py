"""Gateway configuration from the environment (INFERQ_GATEWAY_*).

Redis connection, backlog bound and worker staleness are the producer settings
(INFERQ_REDIS_URL, INFERQ_MAX_BACKLOG, INFERQ_WORKER_STALE_SECONDS, ...), shared
with every other producer.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Optional

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


class GatewaySettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="INFERQ_GATEWAY_", extra="ignore")

    host: str = "127.0.0.1"
    port: int = Field(8000, ge=0, le=65535)
    # Comma-separated "key" or "key:tenant" entries; empty = no authentication.
    api_keys: str = ""
    # Same format, one entry per line (lets secrets live in a mounted file).
    api_keys_file: Optional[str] = None
    max_body_bytes: int = Field(1_048_576, ge=1024)
    max_prompt_chars: int = Field(200_000, ge=1)
    max_prompt_tokens: int = Field(32_768, ge=1)
    max_tokens_cap: int = Field(4096, ge=1)
    # Used when a chat request leaves max_tokens unset.
    default_max_tokens: int = Field(512, ge=1)
    # Jobs from OpenAI routes get this deadline, so an abandoned request cannot
    # occupy a worker forever.
    request_timeout_s: float = Field(600.0, gt=0)
    # Optional allow-list of served model names (comma-separated); empty = any
    # model a worker has registered.
    models: str = ""
    # How chat answers with tool_choice "auto" are searched for tool calls: the
    # format of the served model's family, or "auto" (each format; the first opener found decides).
    tool_parser: Literal["auto", "hermes", "llama3", "mistral"] = "auto"
    # Reasoning models (docs/gateway.md "Reasoning models"): how a chat answer's <think>
    # block becomes reasoning_content, as vLLM's --reasoning-parser: "qwen3" or "deepseek_r1"
    # for every model, or per model ("model-a=qwen3,model-b=deepseek_r1"; "none" turns one
    # off). A model not named gets the family its workers detected from its chat template.
    reasoning_parser: str = ""

    @field_validator("reasoning_parser")
    @classmethod
    def _reasoning_parser_parses(cls, v: str) -> str:
        from inferq.producer.gateway.reasoning import parse_setting

        parse_setting(v)  # ValueError naming the bad entry
        return v

    # SSE comment sent when a stream is idle, so proxies keep the connection.
    keepalive_s: float = Field(15.0, gt=0)
    # Secure by default: a gateway reachable from other machines must have API
    # keys. ``published_on`` is the address clients reach it on when that is not
    # ``host`` (a container binds 0.0.0.0; compose publishes it on GATEWAY_BIND).
    published_on: str = ""
    allow_no_auth: bool = Field(False, description="Serve other machines without API keys (not recommended).")
    # Requests holding a reply-stream reader (generation, job events) at once.
    max_streams: int = Field(1024, ge=1)
    max_streams_per_tenant: int = Field(128, ge=1)
    # Prometheus metrics on a separate port kept off the public one (0 = on the main port).
    metrics_port: int = Field(0, ge=0, le=65535)
    metrics_host: str = "127.0.0.1"
    # -- OpenAI Batch API (docs/gateway.md "Batch API") --
    # Uploaded files and batch output files live here (a volume in a container).
    files_dir: str = "./.inferq/files"
    files_max_bytes: int = Field(200 * 1024 * 1024, ge=1024, description="Largest file POST /v1/files accepts.")
    batch_max_lines: int = Field(50_000, ge=1, description="Most requests in one batch input file.")
    # Files and finished batches older than this are deleted (0 = keep forever).
    files_retention_days: float = Field(30.0, ge=0.0)
    # Lines of one batch enqueued and not yet finished, per batch.
    batch_max_in_flight: int = Field(64, ge=1)
    # Batch lines run at this priority (lower is served first; interactive requests default to 0).
    batch_priority: int = Field(100, ge=-1000, le=1000)
    # How long a cancelled batch waits for its running lines to stop before it is marked cancelled.
    batch_cancel_grace_s: float = Field(120.0, gt=0)
    # Seconds between scans for batches no live gateway is driving (resume after a restart).
    batch_scan_s: float = Field(2.0, gt=0)
    # -- Responses API (docs/gateway.md "Responses API") --
    responses_ttl_s: int = Field(30 * 86_400, ge=60, description="Seconds a stored response (store: true) is kept.")
    responses_max_per_tenant: int = Field(10_000, ge=1, description="Stored responses kept per tenant (oldest go first).")
    responses_background_timeout_s: float = Field(3600.0, gt=0, description="Deadline of a background response's job.")
    # -- operator dashboard (docs/dashboard.md) --
    dashboard: bool = Field(True, description="Serve /dashboard and its JSON API.")
    # Operator (admin) keys, same format as api_keys without tenants: they see every
    # model, worker, DLQ entry, job and batch. Required when the gateway is exposed.
    dashboard_keys: str = ""
    dashboard_keys_file: Optional[str] = None
    # Worker /metrics URLs (comma-separated) the dashboard samples for throughput,
    # TTFT, KV usage, preemptions and the doctor's binding limit.
    dashboard_worker_metrics: str = ""
    dashboard_sample_s: float = Field(2.0, gt=0, description="Seconds between dashboard samples.")
    dashboard_window_s: float = Field(300.0, gt=0, description="How far back the dashboard's charts reach.")
    # -- webhooks (docs/gateway.md "Webhooks") --
    webhooks_enabled: bool = Field(True, description="Run the webhook dispatcher and serve /v1/webhook_endpoints.")
    # Operator endpoints: JSON {"tenant": [{"url", "secret", "events"}]} or "@/path/to/file.json"; "*" = every tenant.
    webhooks: str = ""
    webhook_allow_http: bool = Field(False, description="Let tenants register plain-http endpoints (default: https only).")
    webhook_max_endpoints: int = Field(16, ge=1, description="Endpoints one tenant may register.")
    webhook_timeout_s: float = Field(10.0, gt=0, description="Seconds an endpoint has to answer one delivery.")
    webhook_max_attempts: int = Field(12, ge=1, description="Attempts before a delivery is dead-lettered.")
    webhook_max_age_s: float = Field(72 * 3600.0, gt=0, description="Age after which a failing delivery is dead-lettered.")
    webhook_backoff_s: float = Field(5.0, gt=0, description="First retry delay; doubles per attempt (with jitter).")
    webhook_backoff_max_s: float = Field(3600.0, gt=0)
    webhook_concurrency: int = Field(32, ge=1, description="Deliveries one gateway sends at once.")
    # A completion record read by a gateway this long ago and not handled: its gateway died.
    webhook_claim_idle_s: float = Field(30.0, gt=0)
    webhook_recent_max: int = Field(200, ge=1, description="Recent delivery attempts kept for the dashboard.")
    webhook_dead_max: int = Field(10_000, ge=1, description="Dead-lettered deliveries kept (per partition).")


@dataclass(frozen=True)
class Principal:
    """Who is calling. ``tenant`` None means unrestricted (no keys, or a key without tenant)."""

    tenant: Optional[str] = None


def parse_api_keys(settings: GatewaySettings) -> dict[str, Principal]:
    entries = [e for e in settings.api_keys.split(",")]
    if settings.api_keys_file:
        entries += Path(settings.api_keys_file).read_text().splitlines()
    keys: dict[str, Principal] = {}
    for raw in entries:
        raw = raw.strip()
        if not raw or raw.startswith("#"):
            continue
        key, _, tenant = raw.partition(":")
        key, tenant = key.strip(), tenant.strip()
        if not key:
            raise ValueError("an API key entry has an empty key")
        keys[key] = Principal(tenant=tenant or None)
    return keys


def _loopback(host: str) -> bool:
    import ipaddress

    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a host name: may be reachable from anywhere


def check_exposure(settings: GatewaySettings, keys: dict[str, Principal]) -> None:
    """Refuse to serve other machines without authentication (unless told to)."""
    exposed = settings.published_on or settings.host
    if keys or settings.allow_no_auth or _loopback(exposed):
        return
    raise ValueError(f"the gateway would serve {exposed} without API keys: set INFERQ_GATEWAY_API_KEYS (or "
                     "--api-keys), bind/publish on 127.0.0.1, or set INFERQ_GATEWAY_ALLOW_NO_AUTH=true to accept "
                     "unauthenticated requests from other machines")


def allowed_models(settings: GatewaySettings) -> list[str]:
    return [m.strip() for m in settings.models.split(",") if m.strip()]


def parse_dashboard_keys(settings: GatewaySettings) -> frozenset[str]:
    """Operator keys (no tenants: an operator sees every tenant)."""
    entries = settings.dashboard_keys.split(",")
    if settings.dashboard_keys_file:
        entries += Path(settings.dashboard_keys_file).read_text().splitlines()
    out = set()
    for raw in entries:
        raw = raw.strip()
        if not raw or raw.startswith("#"):
            continue
        if ":" in raw:
            raise ValueError("a dashboard key has no tenant (an operator sees every tenant): drop the ':tenant' part")
        out.add(raw)
    return frozenset(out)


def is_exposed(settings: GatewaySettings) -> bool:
    """Whether other machines can reach the gateway."""
    return not _loopback(settings.published_on or settings.host)


def worker_metrics_urls(settings: GatewaySettings) -> list[str]:
    return [u.strip() for u in settings.dashboard_worker_metrics.split(",") if u.strip()]
