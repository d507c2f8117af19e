"""Fixtures for the reliability suite.

Starting a worker costs seconds (torch + transformers imports), so workers are
shared: one session "fleet" of two workers on a Redis that only an ACL user
limited to ``inferq:*`` keys can use (so every fuzz/limits/gateway test also
proves the ACL setup works end to end), and a separate "chaos" Redis (AOF on)
whose workers the chaos and soak tests kill, stop and start.

Worker processes come from tests/service (WorkerProc); gateways from
tests/gateway/stack.py (running_gateway).
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Optional

import pytest
import redis

from inferq.bench.process_memory import proc_kib
from inferq.schemas import keys
from tests.conftest import RedisServer
from tests.service.conftest import tiny_model, wait_for  # noqa: F401  (tiny_model is a fixture)
from tests.workers import WorkerProc

MODEL = "tiny"
ADMIN_PW = "admin-pw-9f2"
USER = "inferq"
USER_PW = "inferq-pw-31c"
# The inferq user: every command except the dangerous ones (FLUSHALL, CONFIG,
# KEYS, DEBUG, ...), on inferq's keys and channels only.
ACL_RULES = ["reset", "on", f">{USER_PW}", "resetchannels", "~inferq:*", "&inferq:*", "+@all", "-@dangerous"]


class SecureRedis:
    """redis-server with a default-user password and a restricted ACL user."""

    def __init__(self, tmp: Path):
        self.server = RedisServer(tmp, password=ADMIN_PW, appendonly=True).start()
        self.port = self.server.port
        self.admin_url = self.server.url
        self.user_url = f"redis://{USER}:{USER_PW}@127.0.0.1:{self.port}/0"
        admin = redis.Redis.from_url(self.admin_url)
        admin.execute_command("ACL", "SETUSER", USER, *ACL_RULES)
        admin.close()

    def admin(self) -> redis.Redis:
        return redis.Redis.from_url(self.admin_url)

    def stop(self) -> None:
        self.server.stop()


class Fleet:
    """Named worker processes of one model on one Redis, started on demand."""

    def __init__(self, redis_url: str, model_folder: Path, model: str, log_dir: Path, *extra: str):
        self.redis_url, self.model_folder, self.model, self.log_dir = redis_url, model_folder, model, log_dir
        self.extra = extra
        self.workers: dict[str, WorkerProc] = {}

    def start(self, *names: str, extra: tuple = ()) -> list[WorkerProc]:
        """Start workers in parallel (model loads overlap), wait until all are ready."""
        procs = []
        for name in names:
            w = WorkerProc(self.redis_url, self.model_folder, self.model, self.log_dir, name, *self.extra, *extra,
                           metrics=True)
            self.workers[name] = w
            procs.append(w)
        for w in procs:
            w.wait_ready()
        return procs

    def alive(self) -> list[WorkerProc]:
        return [w for w in self.workers.values() if w.proc.poll() is None]

    def ensure(self, *names: str) -> list[WorkerProc]:
        """These workers running (starting the ones that are not)."""
        missing = [n for n in names if n not in self.workers or self.workers[n].proc.poll() is not None]
        if missing:
            self.start(*missing)
        return [self.workers[n] for n in names]

    def ensure_count(self, n: int, prefix: str) -> list[WorkerProc]:
        """At least ``n`` live workers, new ones named ``prefix-1``, ``prefix-2``, ..."""
        new, i = [], 0
        while len(self.alive()) + len(new) < n:
            i += 1
            name = f"{prefix}-{i}"
            if name not in self.workers or self.workers[name].proc.poll() is not None:
                new.append(name)
        if new:
            self.start(*new)
        return self.alive()

    def stop_all(self) -> None:
        for w in self.workers.values():
            w.terminate(timeout=20)


@pytest.fixture(scope="session")
def secure_redis(tmp_path_factory):
    s = SecureRedis(tmp_path_factory.mktemp("secure-redis"))
    yield s
    s.stop()


@pytest.fixture(scope="session")
def fleet(secure_redis, tiny_model, tmp_path_factory) -> Fleet:
    """Two workers of model "tiny", connected as the restricted ACL user."""
    f = Fleet(secure_redis.user_url, tiny_model, MODEL, tmp_path_factory.mktemp("fleet-logs"))
    f.start("fleet-a", "fleet-b")
    yield f
    f.stop_all()


@pytest.fixture
def r(secure_redis):
    """A client as the inferq ACL user (what producers and tests use)."""
    c = redis.Redis.from_url(secure_redis.user_url)
    yield c
    c.close()


class ChaosStack:
    """Redis with AOF on, restartable on the same port and data folder."""

    def __init__(self, tmp: Path, model_folder: Path):
        (tmp / "data").mkdir()
        self.server = RedisServer(tmp / "data", appendonly=True).start()
        self.url = self.server.url
        self.fleet = Fleet(self.url, model_folder, "chaos", tmp, "--reply-ttl", "4", "--max-num-seqs", "64")

    def stop_redis(self) -> None:
        """SIGTERM: redis-server fsyncs its AOF and exits."""
        self.server.stop()

    def start_redis(self) -> None:
        """Start again on the same port and data folder (RedisServer keeps its port)."""
        self.server.start()

    def client(self) -> redis.Redis:
        return redis.Redis.from_url(self.url)


@pytest.fixture(scope="session")
def chaos_model(tmp_path_factory) -> Path:
    """The tiny Llama with room for long jobs (4096 positions): a job that cannot
    finish inside a drain window on any machine."""
    from tests.tiny_models import save_tiny_model

    return save_tiny_model("llama", tmp_path_factory.mktemp("chaos-model") / "llama", max_position_embeddings=4096)


@pytest.fixture(scope="session")
def chaos(tmp_path_factory, chaos_model):
    s = ChaosStack(tmp_path_factory.mktemp("chaos"), chaos_model)
    yield s
    s.fleet.stop_all()
    s.server.stop()


@pytest.fixture(scope="session")
def chaos_oracle(chaos_model):
    """The same model in-process: what a clean greedy run prints."""
    import torch

    from inferq.gpuworker import LLM

    torch.set_num_threads(1)
    return LLM(model=str(chaos_model), dtype="float32", num_kv_blocks=512, max_num_seqs=64)


def reply_events(r: redis.Redis, job_id: str) -> list:
    from inferq.schemas import decode_event

    return [decode_event(f) for _, f in r.xrange(keys.reply(job_id))]


def pending_count(r: redis.Redis, model: str) -> int:
    try:
        return int(r.xpending(keys.jobs(model), keys.JOBS_GROUP)["pending"])
    except redis.ResponseError:  # no group yet
        return 0


def rss_kib(pid: int) -> Optional[int]:
    try:
        return proc_kib(pid, "VmRSS")
    except (OSError, LookupError):  # gone, or a zombie (no VmRSS line)
        return None


__all__ = ["Fleet", "ChaosStack", "SecureRedis", "MODEL", "wait_for", "reply_events", "pending_count", "rss_kib"]
