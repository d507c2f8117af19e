"""TLS (rediss://) end to end: a redis-server that only speaks TLS, with a CA and
server/client certificates made here by openssl; a real worker process, the SDK
and the gateway all connect with the INFERQ_REDIS_TLS_* settings, and a client
without the CA is refused with a clear error."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import httpx
import pytest
import redis

from inferq.producer import Producer
from tests.conftest import free_port, redis_server_binary
from tests.gateway.stack import running_gateway
from tests.service.conftest import WorkerProc, wait_for

MODEL = "tiny-tls"


def openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def make_certs(d: Path) -> dict[str, Path]:
    """A CA, a server certificate for 127.0.0.1/localhost, a client certificate."""
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.crt", "-days", "2",
            "-subj", "/CN=inferq-test-ca", cwd=d)
    (d / "san.ext").write_text("subjectAltName=DNS:localhost,IP:127.0.0.1\n")
    for name in ("server", "client"):
        openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.csr",
                "-subj", f"/CN={name}", cwd=d)
        openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
                "-out", f"{name}.crt", "-days", "2", "-extfile", "san.ext", cwd=d)
    return {n: d / n for n in ("ca.crt", "server.crt", "server.key", "client.crt", "client.key")}


def tls_capable(binary: str) -> bool:
    """A build without TLS rejects the tls-port directive itself; one with TLS
    gets as far as the deliberately unknown directive after it (and exits)."""
    out = subprocess.run([binary, "--port", "0", "--tls-port", "0", "--no-such-directive", "1"],
                         capture_output=True, text=True, timeout=10)
    return "tls-port" not in (out.stdout + out.stderr)


@pytest.fixture(scope="module")
def tls_redis(tmp_path_factory):
    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed, so no certificates can be made for the TLS test")
    binary = redis_server_binary()
    if not tls_capable(binary):
        pytest.skip(f"{binary} was built without TLS support")
    d = tmp_path_factory.mktemp("tls")
    certs = make_certs(d)
    port = free_port()
    proc = subprocess.Popen([binary, "--port", "0", "--tls-port", str(port), "--bind", "127.0.0.1",
                             "--tls-cert-file", str(certs["server.crt"]), "--tls-key-file", str(certs["server.key"]),
                             "--tls-ca-cert-file", str(certs["ca.crt"]), "--tls-auth-clients", "yes",
                             "--save", "", "--appendonly", "no", "--dir", str(d)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"rediss://127.0.0.1:{port}/0"
    env = {"INFERQ_REDIS_TLS_CA_CERTS": str(certs["ca.crt"]), "INFERQ_REDIS_TLS_CERTFILE": str(certs["client.crt"]),
           "INFERQ_REDIS_TLS_KEYFILE": str(certs["client.key"])}
    client = redis.Redis.from_url(url, ssl_ca_certs=env["INFERQ_REDIS_TLS_CA_CERTS"],
                                  ssl_certfile=env["INFERQ_REDIS_TLS_CERTFILE"],
                                  ssl_keyfile=env["INFERQ_REDIS_TLS_KEYFILE"])
    for _ in range(100):
        try:
            client.ping()
            break
        except redis.ConnectionError:
            if proc.poll() is not None:
                pytest.fail("the TLS redis-server exited at start")
            import time
            time.sleep(0.1)
    client.close()
    yield url, env, certs
    proc.terminate()
    proc.wait(10)


def test_worker_sdk_and_gateway_over_tls(tls_redis, tiny_model, tmp_path, monkeypatch):
    url, env, _ = tls_redis
    for k, v in env.items():
        monkeypatch.setenv(k, v)  # the worker subprocess inherits them too
    w = WorkerProc(url, tiny_model, MODEL, tmp_path, "tls-1")
    p = Producer(redis_url=url, default_model=MODEL)
    try:
        wait_for(lambda: p.workers() or w.proc.poll() is not None, 180, interval=0.2, what="worker heartbeat over TLS")
        assert w.proc.poll() is None, w.log()[-3000:]
        res = p.submit("over tls", sampling={"max_tokens": 6, "temperature": 0, "ignore_eos": True}).result(timeout=120)
        assert res.finish_reason == "length" and res.usage.completion_tokens == 6 and res.text
        with running_gateway(url, producer={"default_model": MODEL}) as gw:
            assert httpx.get(f"{gw}/ready", timeout=30).status_code == 200
            chat = httpx.post(f"{gw}/v1/completions", json={"model": MODEL, "prompt": "over tls", "max_tokens": 6,
                                                            "temperature": 0}, timeout=120)
            assert chat.status_code == 200, chat.text
            assert chat.json()["choices"][0]["text"] == res.text  # same greedy text through either path
    finally:
        p.close()
        w.terminate()


def test_a_client_without_the_ca_is_refused_clearly(tls_redis, monkeypatch):
    url, env, _ = tls_redis
    for k in env:
        monkeypatch.delenv(k, raising=False)
    with pytest.raises(redis.ConnectionError, match="(?i)certificate|ssl|tls"):
        Producer(redis_url=url, default_model=MODEL).submit("x")
