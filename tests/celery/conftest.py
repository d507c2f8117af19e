import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from inferq.processes import terminate
from tests.cli.procs import LineReader, env_without
from tests.gateway.stack import shared_stack, stop_shared_stack

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def stack(tmp_path_factory):
    s = shared_stack(tmp_path_factory)
    yield s
    stop_shared_stack()


def celery_env(stack, **extra):
    return env_without("INFERQ_REDIS_URL", INFERQ_REDIS_URL=stack.url, PYTHONPATH=str(ROOT), **extra)


def launch_celery(env: dict, cwd, name: str, concurrency: int = 4) -> tuple[subprocess.Popen, LineReader]:
    """A real `celery worker` process (threads pool: tasks only wait on Redis, no
    model runs in Celery) on queue inferq, and a reader of its output."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "inferq.producer.celery_app", "worker", "-P", "threads", "-c",
         str(concurrency), "-Q", "inferq", "-n", f"{name}@%h", "--without-mingle", "--without-gossip", "-l", "info"],
        cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return proc, LineReader(proc.stdout)


def stop_celery(proc: subprocess.Popen) -> None:
    terminate(proc, 20)  # SIGTERM: Celery finishes its tasks; SIGKILL past 20 s


@pytest.fixture(scope="module")
def celery_worker(stack, tmp_path_factory):
    """A real `celery worker` process on the real Redis broker."""
    env = celery_env(stack, INFERQ_LEASE_SECONDS="0.2", INFERQ_MAX_DELIVERIES="3")
    proc, out = launch_celery(env, tmp_path_factory.mktemp("celery"), "test")
    end = time.monotonic() + 60
    while not any("ready." in line for line in out.lines):
        assert proc.poll() is None and time.monotonic() < end, out.text()
        time.sleep(0.1)
    yield out
    stop_celery(proc)


@pytest.fixture(scope="module")
def celery_app(stack, celery_worker):
    """The client side (the tasks module), pointed at the same broker as the worker."""
    saved = os.environ.get("INFERQ_REDIS_URL")
    os.environ["INFERQ_REDIS_URL"] = stack.url
    from inferq.producer import celery_tasks

    celery_tasks.app.conf.update(broker_url=stack.url, result_backend=stack.url)
    yield celery_tasks
    if saved is None:
        os.environ.pop("INFERQ_REDIS_URL", None)
    else:
        os.environ["INFERQ_REDIS_URL"] = saved
