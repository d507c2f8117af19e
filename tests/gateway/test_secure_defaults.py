"""Secure defaults of the gateway process: it refuses to serve other machines
without API keys (unless told to), and can keep /metrics off the public port."""
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

from tests.conftest import free_port

ROOT = Path(__file__).resolve().parents[2]


def gateway(redis_url: str, *args: str, **env: str) -> subprocess.Popen:
    full = {k: v for k, v in os.environ.items() if not k.startswith("INFERQ_GATEWAY_")}
    full.update(INFERQ_REDIS_URL=redis_url, PYTHONPATH=str(ROOT), **env)
    return subprocess.Popen([sys.executable, "-m", "inferq.producer.gateway", *args], env=full, cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def wait_listening(url: str, proc: subprocess.Popen, timeout: float = 60) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        assert proc.poll() is None, proc.stdout.read()
        try:
            httpx.get(f"{url}/health", timeout=1)
            return
        except httpx.TransportError:
            time.sleep(0.1)
    raise AssertionError("gateway did not start")


def test_public_bind_without_keys_is_refused_with_a_clear_message(redis_url):
    proc = gateway(redis_url, "--host", "0.0.0.0", "--port", str(free_port()))
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode != 0
    assert "without API keys" in out and "INFERQ_GATEWAY_API_KEYS" in out and "Traceback" not in out
    # Published on loopback only (compose's default), or explicitly allowed: it starts.
    for env in ({"INFERQ_GATEWAY_PUBLISHED_ON": "127.0.0.1"}, {"INFERQ_GATEWAY_ALLOW_NO_AUTH": "true"},
                {"INFERQ_GATEWAY_API_KEYS": "k1:acme"}):
        port = free_port()
        p = gateway(redis_url, "--host", "0.0.0.0", "--port", str(port), **env)
        try:
            wait_listening(f"http://127.0.0.1:{port}", p)
        finally:
            p.send_signal(signal.SIGTERM)
            p.wait(30)


def test_metrics_port_keeps_metrics_off_the_public_port(redis_url):
    port, mport = free_port(), free_port()
    proc = gateway(redis_url, "--port", str(port), INFERQ_GATEWAY_METRICS_PORT=str(mport))
    try:
        wait_listening(f"http://127.0.0.1:{port}", proc)
        assert httpx.get(f"http://127.0.0.1:{port}/health", timeout=10).status_code == 200
        assert httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).status_code == 404
        text = httpx.get(f"http://127.0.0.1:{mport}/metrics", timeout=10).text
        assert 'inferq_gateway_requests_total{method="GET",route="/health",status="200"}' in text
        assert httpx.get(f"http://127.0.0.1:{mport}/v1/models", timeout=10).status_code == 404  # metrics only
    finally:
        proc.send_signal(signal.SIGTERM)
        # Both listeners stop on one signal (uvicorn re-raises SIGTERM after its shutdown).
        assert proc.wait(30) in (0, -signal.SIGTERM)
