"""Worker configuration: flags over INFERQ_* env over defaults, clear errors."""
from __future__ import annotations

import subprocess
import sys
import time

import pytest

from inferq.gpuworker.service.cli import main, parser
from inferq.gpuworker.service.settings import WorkerSettings
from inferq.schemas import keys
from tests.conftest import RedisServer


def _settings(argv):
    given = {k: v for k, v in vars(parser().parse_args(argv)).items() if v is not None}
    return WorkerSettings(**given)


def test_flags_override_env_and_defaults(monkeypatch):
    monkeypatch.setenv("INFERQ_REDIS_URL", "redis://:pw@redis.internal:6380/2")
    monkeypatch.setenv("INFERQ_MAX_NUM_SEQS", "7")
    monkeypatch.setenv("INFERQ_LEASE_SECONDS", "4")
    s = _settings(["--max-num-seqs", "9", "--worker-id", "gpu-3", "--coalesce-deltas", "--metrics-port", "9100"])
    assert s.redis_url == "redis://:pw@redis.internal:6380/2"
    assert s.max_num_seqs == 9 and s.lease_seconds == 4.0 and s.coalesce_deltas is True
    assert s.consumer_name == "gpu-3" and s.metrics_port == 9100
    assert s.safe_dump()["redis_url"] == "redis://:***@redis.internal:6380/2"
    assert "pw" not in str(s.safe_dump())


def test_model_name_defaults(monkeypatch):
    monkeypatch.delenv("INFERQ_MODEL", raising=False)
    monkeypatch.delenv("INFERQ_SERVED_MODEL_NAME", raising=False)
    assert WorkerSettings().model_name == keys.DEFAULT_MODEL
    assert WorkerSettings(model="/models/Qwen2.5-0.5B/").model_name == "Qwen2.5-0.5B"
    assert WorkerSettings(model="/m/llama-q8.gguf").model_name == "llama-q8"
    assert WorkerSettings(model="/m/x", served_model_name="prod").model_name == "prod"


def test_tls_and_acl_settings_reach_redis_py():
    s = WorkerSettings(redis_url="rediss://cache:6380/0", redis_username="inferq", redis_password="pw",
                       redis_tls_ca_certs="/etc/ca.pem")
    kw = s.client_kwargs()
    assert kw["username"] == "inferq" and kw["password"] == "pw" and kw["ssl_ca_certs"] == "/etc/ca.pem"
    assert kw["socket_timeout"] > s.block_ms / 1000
    assert "ssl_ca_certs" not in WorkerSettings(redis_tls_ca_certs="/etc/ca.pem").client_kwargs()  # plain redis://


def test_invalid_config_exits_2(capsys):
    assert main(["--block-ms", "40000"]) == 2
    assert "block_ms" in capsys.readouterr().err
    assert main(["--max-num-seqs", "0"]) == 2


def test_wrong_redis_password_fails_fast_with_clear_message(tmp_path):
    server = RedisServer(tmp_path, password="right").start()
    try:
        t0 = time.time()
        out = subprocess.run(
            [sys.executable, "-m", "inferq.gpuworker.service", "--redis-url", f"redis://:wrong@127.0.0.1:{server.port}/0"],
            capture_output=True, text=True, timeout=120,
        )
        assert out.returncode == 1
        assert "refused the credentials" in out.stderr
        assert time.time() - t0 < 60  # before any model is loaded
    finally:
        server.stop()


def test_every_setting_is_a_flag_and_engine_knobs_map_one_to_one(monkeypatch):
    """Flags are generated from WorkerSettings; engine knobs keep the engine's defaults."""
    from inferq.gpuworker.config import EngineConfig
    from inferq.gpuworker.service.cli import NOT_FLAGS
    from inferq.gpuworker.service.settings import ENGINE_KNOBS

    for k in ENGINE_KNOBS:
        monkeypatch.delenv(f"INFERQ_{k.upper()}", raising=False)
    flags = {a.dest for a in parser()._actions}
    assert set(WorkerSettings.model_fields) - NOT_FLAGS <= flags
    assert "redis_password" not in flags  # secrets stay off the command line
    cfg = _settings(["--max-num-batched-tokens", "512", "--block-size", "32"]).engine_config()
    assert (cfg.max_num_batched_tokens, cfg.block_size, cfg.scheduling_policy) == (512, 32, "priority")
    assert WorkerSettings().max_num_seqs == EngineConfig().max_num_seqs  # one default per knob


def test_cpu_threads_leave_one_core_to_the_queue_work(monkeypatch):
    import os

    import torch

    from inferq.gpuworker.service.worker import set_cpu_threads

    before = torch.get_num_threads()
    try:
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
        assert set_cpu_threads(WorkerSettings(device="cpu")) == max(1, (os.cpu_count() or 1) - 1)
        assert torch.get_num_threads() == max(1, (os.cpu_count() or 1) - 1)
        monkeypatch.setenv("OMP_NUM_THREADS", "3")
        assert set_cpu_threads(WorkerSettings(device="cpu")) == 3 == torch.get_num_threads()
        s = _settings(["--torch-threads", "1", "--device", "cpu"])
        assert s.torch_threads == 1 and set_cpu_threads(s) == 1 == torch.get_num_threads()
    finally:
        torch.set_num_threads(before)


def test_gpu_memory_share_and_cuda_graphs_are_worker_settings(monkeypatch):
    """INFERQ_GPU_MEMORY_UTILIZATION and INFERQ_CUDA_GRAPHS reach the engine's config."""
    from inferq.gpuworker.service.settings import WorkerSettings

    monkeypatch.setenv("INFERQ_GPU_MEMORY_UTILIZATION", "0.5")
    monkeypatch.setenv("INFERQ_CUDA_GRAPHS", "false")
    cfg = WorkerSettings().engine_config()
    assert cfg.gpu_memory_utilization == 0.5 and cfg.cuda_graphs is False
