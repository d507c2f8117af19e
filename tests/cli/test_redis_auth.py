"""Redis with a password, configured the same way for the CLI, the gateway and
Celery (INFERQ_REDIS_URL + INFERQ_REDIS_PASSWORD)."""
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.cli.procs import env_without
from tests.conftest import RedisServer
from tests.gateway.stack import running_gateway

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def locked_redis(tmp_path_factory):
    server = RedisServer(tmp_path_factory.mktemp("locked"), password="s3cret-pw").start()
    yield server
    server.stop()


def cli(*args, **env):
    return subprocess.run([sys.executable, "-m", "inferq.cli", *args], capture_output=True, text=True, timeout=60,
                          env=env_without("INFERQ_REDIS_URL", "INFERQ_REDIS_PASSWORD", PYTHONPATH=str(ROOT), **env))


def test_cli_with_and_without_the_password(locked_redis):
    url = f"redis://127.0.0.1:{locked_redis.port}/0"
    ok = cli("status", "--json", INFERQ_REDIS_URL=url, INFERQ_REDIS_PASSWORD="s3cret-pw")
    assert ok.returncode == 0 and ok.stdout.strip() == "[]"
    assert cli("status", INFERQ_REDIS_URL=locked_redis.url).returncode == 0  # password in the URL
    denied = cli("status", INFERQ_REDIS_URL=url)
    assert denied.returncode == 1 and "Redis" in denied.stderr
    wrong = cli("status", INFERQ_REDIS_URL=url, INFERQ_REDIS_PASSWORD="nope")
    assert wrong.returncode == 1 and "credentials" in wrong.stderr


def test_gateway_health_reflects_redis_auth(locked_redis):
    with running_gateway(locked_redis.url) as ok_url:
        assert httpx.get(f"{ok_url}/health", timeout=10).json()["redis"] is True
    with running_gateway(f"redis://127.0.0.1:{locked_redis.port}/0") as bad_url:
        r = httpx.get(f"{bad_url}/health", timeout=10)
        assert r.status_code == 503 and r.json()["redis"] is False


def test_celery_broker_url_carries_the_password(locked_redis):
    code = ("from inferq.producer.celery_app import make_celery; a = make_celery(); import redis;"
            "print(a.conf.broker_url); print(redis.Redis.from_url(a.conf.broker_url).ping())")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT,
                       env=env_without("INFERQ_REDIS_URL", INFERQ_REDIS_URL=f"redis://127.0.0.1:{locked_redis.port}/0",
                                       INFERQ_REDIS_PASSWORD="s3cret-pw"))
    assert r.returncode == 0, r.stderr
    broker, ping = r.stdout.split()
    assert broker == f"redis://:s3cret-pw@127.0.0.1:{locked_redis.port}/0" and ping == "True"
