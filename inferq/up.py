"""`inferq up`: Redis (existing or embedded), one worker and the gateway, as
child processes supervised until Ctrl-C / SIGTERM, then stopped in order:
gateway (no new requests), worker (drains), Redis (flushes its AOF) last.

Children run in their own sessions, so a terminal Ctrl-C reaches only this
supervisor, which decides the order. Nothing is left running on exit.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from rich.console import Console

from inferq.schemas import keys
from inferq.schemas.connection import RedisSettings, redact_url, sync_client
from inferq.schemas.policy import QueuePolicy
from inferq.embedded_redis import EmbeddedRedis, EmbeddedRedisError, free_port, port_is_free, stored_password
from inferq.processes import terminate

DEFAULT_GATEWAY_PORT = 8000
DEFAULT_REDIS_PORT = 6379
DEFAULT_METRICS_PORT = 9400


@dataclass
class UpOptions:
    host: str = "127.0.0.1"
    port: Optional[int] = None
    model: Optional[str] = None
    served_model_name: Optional[str] = None
    device: Optional[str] = None
    data_dir: str = ".inferq"
    redis_port: Optional[int] = None
    metrics_port: Optional[int] = None
    ready_timeout: float = 600.0
    api_keys: Optional[str] = None
    worker_args: list[str] = field(default_factory=list)

    @classmethod
    def from_args(cls, a) -> "UpOptions":
        return cls(host=a.host, port=a.port, model=a.model, served_model_name=a.served_model_name, device=a.device, data_dir=a.data_dir,
                   redis_port=a.redis_port, metrics_port=a.metrics_port, ready_timeout=a.ready_timeout,
                   api_keys=a.api_keys, worker_args=list(a.worker_arg))


def _pick_port(wanted: Optional[int], default: int, host: str = "127.0.0.1") -> int:
    if wanted is not None:
        return wanted if wanted else free_port(host)
    return default if port_is_free(host, default) else free_port(host)


def _redis_reachable(url: str) -> bool:
    return _redis_reachable_with(RedisSettings(redis_url=url, redis_mode="standalone"))


def _redis_reachable_with(settings: RedisSettings) -> bool:
    try:
        r = sync_client(settings.model_copy(update={"socket_connect_timeout": 2, "socket_timeout": 2}))
        ok = bool(r.ping())
        r.close()
        return ok
    except Exception:
        return False


class Child:
    """One supervised process with its log file."""

    def __init__(self, name: str, args: list[str], env: dict, log_path: Path):
        self.name = name
        self.log_path = log_path
        log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(log_path, "ab")
        self.proc = subprocess.Popen(args, env=env, stdout=self._log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, start_new_session=True)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self, timeout: float) -> None:
        terminate(self.proc, timeout)
        self._log.close()

    def tail(self, lines: int = 25) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


class Supervisor:
    def __init__(self, opts: UpOptions, console: Optional[Console] = None):
        self.opts = opts
        self.console = console or Console(highlight=False)
        self.data_dir = Path(opts.data_dir).resolve()
        self.log_dir = self.data_dir / "logs"
        self.redis: Optional[EmbeddedRedis] = None
        self.redis_url = ""
        self.worker: Optional[Child] = None
        self.gateway: Optional[Child] = None
        self.worker_metrics_url = ""
        self.stop_event = threading.Event()
        self._stopping = False
        self.model = opts.served_model_name or keys.served_name(opts.model)

    # -- start ----------------------------------------------------------
    def start_redis(self) -> None:
        given = RedisSettings()
        if given.sentinel_mode or given.cluster_mode:
            # A Sentinel deployment or a cluster is the operator's: use it (the
            # children inherit INFERQ_REDIS_MODE and the rest), never a local stand-in.
            if not _redis_reachable_with(given):
                raise EmbeddedRedisError(f"INFERQ_REDIS_MODE={given.redis_mode}, but Redis is not reachable "
                                         f"({given.safe_url()})")
            self.redis_url = given.redis_url
            self.console.print(f"[green]✓[/green] Redis {given.safe_url()} (from INFERQ_REDIS_MODE={given.redis_mode})")
            return
        url = given.redis_url if "redis_url" in given.model_fields_set else None  # set by INFERQ_REDIS_URL
        if url:
            if _redis_reachable(url):
                self.redis_url = url
                self.console.print(f"[green]✓[/green] Redis at {redact_url(url)} (from INFERQ_REDIS_URL)")
                return
            self.console.print(f"[yellow]![/yellow] INFERQ_REDIS_URL={redact_url(url)} is not reachable; "
                               "starting an embedded Redis instead")
        self._lock_data_dir()
        port = _pick_port(self.opts.redis_port, DEFAULT_REDIS_PORT)
        # A random password of its own (kept with its data): no other local user
        # or process can read or write the queue.
        redis_dir = self.data_dir / "redis"
        self.redis = EmbeddedRedis(redis_dir, port=port, password=stored_password(redis_dir)).start()
        self.redis_url = self.redis.url
        self.console.print(f"[green]✓[/green] embedded Redis {redact_url(self.redis.url)} (AOF in {self.redis.data_dir}, "
                           f"password in {redis_dir / 'password'})")

    def _lock_data_dir(self) -> None:
        """Two embedded servers on one AOF folder would corrupt it: one `up` per folder."""
        import fcntl

        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._lock = open(self.data_dir / "up.lock", "w")
        try:
            fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            raise EmbeddedRedisError(f"another `inferq up` is using {self.data_dir}; stop it, or pass --data-dir")

    def _child_env(self) -> dict:
        env = dict(os.environ)
        env["INFERQ_REDIS_URL"] = self.redis_url
        env.setdefault("PYTHONUNBUFFERED", "1")
        # `python -m` would put the current folder first on the children's path: run from a
        # web app's folder, its own modules (redis.py, torch.py, ...) would shadow ours.
        env.setdefault("PYTHONSAFEPATH", "1")
        return env

    def start_worker(self, metrics_port: int) -> None:
        env = self._child_env()
        # Settings by environment: the worker reads INFERQ_* (pydantic-settings).
        env["INFERQ_METRICS_PORT"] = str(metrics_port)
        env["INFERQ_METRICS_ADDR"] = "127.0.0.1"
        self.worker_metrics_url = f"http://127.0.0.1:{metrics_port}/metrics"
        if self.opts.model:
            env["INFERQ_MODEL"] = self.opts.model
        if self.opts.served_model_name:
            env["INFERQ_SERVED_MODEL_NAME"] = self.opts.served_model_name
        if self.opts.device:
            env["INFERQ_DEVICE"] = self.opts.device
        args = [sys.executable, "-m", "inferq.gpuworker.service", *self.opts.worker_args]
        self.worker = Child("worker", args, env, self.log_dir / "worker.log")

    def start_gateway(self, port: int) -> None:
        env = self._child_env()
        # The gateway offers the model this worker serves (its default, and its
        # allow-list): a request sent before the worker registers gets a 503, not
        # a 404, and on a shared Redis another model's workers cannot make it say
        # "ready" before its own worker is up.
        env["INFERQ_DEFAULT_MODEL"] = self.model
        env.setdefault("INFERQ_GATEWAY_MODELS", self.model)
        if self.opts.api_keys is not None:
            env["INFERQ_GATEWAY_API_KEYS"] = self.opts.api_keys
        # /dashboard reads the worker it started (running, KV usage, the binding limit, charts).
        if self.worker_metrics_url:
            env.setdefault("INFERQ_GATEWAY_DASHBOARD_WORKER_METRICS", self.worker_metrics_url)
        args = [sys.executable, "-m", "inferq.producer.gateway", "--host", self.opts.host, "--port", str(port)]
        self.gateway = Child("gateway", args, env, self.log_dir / "gateway.log")

    # -- readiness ------------------------------------------------------
    def _gateway_ready(self, url: str) -> Optional[bool]:
        """The gateway's /ready: True once a live worker serves a model, False
        while it answers "not ready", None while it is not listening yet."""
        try:
            with urllib.request.urlopen(f"{url}/ready", timeout=2) as resp:
                return resp.status == 200
        except Exception as e:  # an HTTP error status (503) still means it is listening
            return False if getattr(e, "code", None) is not None else None

    def wait_ready(self, gateway_url: str) -> bool:
        """READY is printed only once the gateway itself says it is ready (a live
        worker serves the model), so the first request after it is served."""
        deadline = time.monotonic() + self.opts.ready_timeout
        gateway_seen = False
        with self.console.status("starting the worker (loading the model) and the gateway…") as status:
            while time.monotonic() < deadline and not self.stop_event.is_set():
                for child in (self.worker, self.gateway):
                    if not child.alive():
                        self.console.print(f"[red]✗ the {child.name} exited with code {child.proc.returncode}; "
                                           f"last lines of {child.log_path}:[/red]")
                        self.console.print(child.tail(), markup=False)
                        return False
                state = self._gateway_ready(gateway_url)
                if state is not None and not gateway_seen:
                    gateway_seen = True
                    self.console.print(f"[green]✓[/green] gateway {gateway_url} (pid {self.gateway.pid})")
                if state:
                    self.console.print(f"[green]✓[/green] worker serving {self.model} (pid {self.worker.pid})")
                    return True
                status.update(f"waiting for {'the worker' if gateway_seen else 'the gateway'}… "
                              f"({int(deadline - time.monotonic())}s left)")
                time.sleep(0.25)
        if not self.stop_event.is_set():
            self.console.print(f"[red]✗ not ready within {self.opts.ready_timeout:.0f}s; see {self.log_dir}[/red]")
        return False

    # -- run / stop -----------------------------------------------------
    def banner(self, url: str) -> None:
        key = (self.opts.api_keys or "").split(",")[0].split(":")[0] or "none"
        auth = f' -H "Authorization: Bearer {key}"' if self.opts.api_keys else ""
        curl = (f"curl {url}/v1/chat/completions -H 'Content-Type: application/json'{auth} \\\n"
                f"  -d '{{\"model\": \"{self.model}\", \"messages\": [{{\"role\": \"user\", "
                f"\"content\": \"Write a haiku about queues\"}}], \"max_tokens\": 64}}'")
        py = (f"from openai import OpenAI\n"
              f"client = OpenAI(base_url=\"{url}/v1\", api_key=\"{key}\")\n"
              f"r = client.chat.completions.create(model=\"{self.model}\", max_tokens=64,\n"
              f"    messages=[{{\"role\": \"user\", \"content\": \"Write a haiku about queues\"}}])\n"
              f"print(r.choices[0].message.content)")
        # The CLI of the environment `up` runs from (e.g. .venv/bin/inferq), so it pastes as is.
        venv_cli = Path(sys.executable).parent / "inferq"
        cli = str(venv_cli) if venv_cli.exists() else "inferq"
        c = self.console
        c.rule(f"[bold green]inferq is ready[/bold green] at {url} (model {self.model})")
        # Examples go out as plain text: no wrapping or borders, so they paste as they are.
        print(f"\n# curl\n{curl}\n\n# python (pip install openai)\n{py}\n\n"
              f"# CLI in another terminal\nexport INFERQ_REDIS_URL={self._shown_redis_url()}\n"
              f"{cli} submit \"The capital of France is\"; {cli} status\n", flush=True)
        c.print(f"logs: {self.log_dir}   stop: Ctrl-C")
        c.print(f"READY {url}", markup=False, highlight=False)

    def _shown_redis_url(self) -> str:
        """The URL to paste, with the embedded server's password read from its file
        by the shell rather than printed."""
        if self.redis is None or not self.redis.password:
            return self.redis_url
        return f"redis://:$(cat {self.redis.data_dir / 'password'})@{self.redis.host}:{self.redis.port}/0"

    def _on_signal(self, signum, frame) -> None:
        if self._stopping:
            # A second Ctrl-C while draining: do not wait any longer.
            for proc in self._procs():
                if proc.poll() is None:
                    proc.kill()
            return
        self.stop_event.set()

    def _procs(self) -> list:
        procs = [c.proc for c in (self.gateway, self.worker) if c is not None]
        if self.redis and self.redis.proc:
            procs.append(self.redis.proc)
        return procs

    def run(self) -> int:
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, self._on_signal)
        rc = 1
        try:
            self.start_redis()
            port = _pick_port(self.opts.port, DEFAULT_GATEWAY_PORT, self.opts.host)
            metrics_port = _pick_port(self.opts.metrics_port, DEFAULT_METRICS_PORT)
            shown_host = "127.0.0.1" if self.opts.host in ("0.0.0.0", "") else self.opts.host
            url = f"http://{shown_host}:{port}"
            self.start_worker(metrics_port)
            self.start_gateway(port)
            self.console.print(f"  worker metrics: http://127.0.0.1:{metrics_port}/metrics "
                               f"(inferq doctor --metrics-url http://127.0.0.1:{metrics_port}/metrics)")
            if not self.wait_ready(url):
                return 0 if self.stop_event.is_set() else 1
            self.banner(url)
            sys.stdout.flush()
            rc = self.supervise()
        except EmbeddedRedisError as e:
            self.console.print(f"[red]error:[/red] {e}")
        finally:
            self.shutdown()
        return rc

    def supervise(self) -> int:
        while not self.stop_event.wait(0.5):
            for child in (self.worker, self.gateway):
                if not child.alive():
                    self.console.print(f"[red]✗ the {child.name} exited unexpectedly (code {child.proc.returncode});"
                                       f" stopping. Last lines of {child.log_path}:[/red]")
                    self.console.print(child.tail(), markup=False)
                    return 1
            if self.redis and self.redis.proc.poll() is not None:
                self.console.print("[red]✗ the embedded Redis exited unexpectedly; stopping[/red]")
                return 1
        return 0

    def shutdown(self) -> None:
        self._stopping = True
        self.console.print("stopping… (the worker finishes in-flight jobs; Ctrl-C again to kill at once)")
        if self.gateway:
            self.gateway.stop(timeout=10)
        if self.worker:
            # The worker drains in-flight jobs on SIGTERM, for the policy's drain timeout.
            self.worker.stop(timeout=QueuePolicy().drain_timeout + 15)
        if self.redis:
            self.redis.stop()
        self.console.print("[green]✓[/green] stopped")


def run_up(opts: UpOptions) -> int:
    return Supervisor(opts).run()
