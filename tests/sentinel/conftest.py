"""A real Sentinel deployment for the tests: 1 master, 1 replica (--replicaof)
and 3 sentinels (quorum 2) on free loopback ports, each a redis-server process
started in the test's tmp dir. Fast failure detection (down-after 1 s,
failover-timeout 3 s) so a failover takes seconds; every wait is on something
observed (a sentinel's answer), with a timeout."""
from __future__ import annotations

import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Optional

import pytest
import redis

from tests.conftest import free_port, redis_server_binary
from tests.service.conftest import offline_llm, start_worker, tiny_model, wait_for  # noqa: F401  (fixtures)

SERVICE = "mymaster"


def _sentinel_support() -> Optional[str]:
    """None when redis-server can run as a sentinel, else why not."""
    binary = redis_server_binary()
    out = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=10).stdout
    if "v=" not in out:
        return f"{binary} does not report a version"
    major = int(out.split("v=")[1].split(".")[0])
    if major < 6:  # `sentinel resolve-hostnames` / announce options and WAIT semantics we rely on
        return f"{binary} is Redis {major}.x; the Sentinel tests need 6.2 or newer"
    return None


def _wait_port(port: int, proc: subprocess.Popen, timeout: float = 10) -> None:
    end = time.time() + timeout
    while time.time() < end:
        if proc.poll() is not None:
            raise RuntimeError(f"process for port {port} exited with {proc.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"nothing listening on {port}")


class SentinelDeployment:
    def __init__(self, tmp: Path, down_after_ms: int = 1000, failover_timeout_ms: int = 3000):
        self.tmp = tmp
        self.binary = redis_server_binary()
        self.master_port, self.replica_port = free_port(), free_port()
        self.sentinel_ports = [free_port() for _ in range(3)]
        self.down_after_ms, self.failover_timeout_ms = down_after_ms, failover_timeout_ms
        self.procs: dict[int, subprocess.Popen] = {}

    # -- processes ---------------------------------------------------------
    def _data_node(self, port: int, *extra: str) -> None:
        d = self.tmp / f"node-{port}"
        d.mkdir()
        args = [self.binary, "--port", str(port), "--bind", "127.0.0.1", "--dir", str(d), "--save", "",
                "--appendonly", "no", "--maxmemory-policy", "noeviction", *extra]
        self.procs[port] = subprocess.Popen(args, stdout=open(d / "log", "wb"), stderr=subprocess.STDOUT)
        _wait_port(port, self.procs[port])

    def _sentinel(self, port: int) -> None:
        d = self.tmp / f"sentinel-{port}"
        d.mkdir()
        conf = d / "sentinel.conf"  # sentinels rewrite their config: one file each
        conf.write_text("\n".join([
            f"port {port}", "bind 127.0.0.1", f"dir {d}",
            "sentinel announce-ip 127.0.0.1",
            f"sentinel monitor {SERVICE} 127.0.0.1 {self.master_port} 2",
            f"sentinel down-after-milliseconds {SERVICE} {self.down_after_ms}",
            f"sentinel failover-timeout {SERVICE} {self.failover_timeout_ms}",
            f"sentinel parallel-syncs {SERVICE} 1", ""]))
        self.procs[port] = subprocess.Popen([self.binary, str(conf), "--sentinel"],
                                            stdout=open(d / "log", "wb"), stderr=subprocess.STDOUT)
        _wait_port(port, self.procs[port])

    def start(self) -> "SentinelDeployment":
        self._data_node(self.master_port)
        self._data_node(self.replica_port, "--replicaof", "127.0.0.1", str(self.master_port))
        for p in self.sentinel_ports:
            self._sentinel(p)
        self.wait_healthy(60)
        return self

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.terminate()
        for proc in self.procs.values():
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def kill_master(self) -> int:
        """SIGKILL the current master; its port."""
        port = self.master_port
        self.procs[port].send_signal(signal.SIGKILL)
        self.procs[port].wait(10)
        return port

    # -- observation ---------------------------------------------------------
    def sentinel(self, port: int) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=port, socket_timeout=5, decode_responses=True)

    def master_addr(self, port: int) -> Optional[tuple[str, int]]:
        r = self.sentinel(port)
        try:
            addr = r.sentinel_get_master_addr_by_name(SERVICE)
        except redis.ConnectionError:
            return None
        finally:
            r.close()
        return (addr[0], int(addr[1])) if addr else None

    def _healthy(self) -> bool:
        """Every sentinel sees the master, the replica (link up) and the 2 other sentinels."""
        for port in self.sentinel_ports:
            r = self.sentinel(port)
            try:
                m = r.sentinel_master(SERVICE)
                replicas = r.sentinel_slaves(SERVICE)
            finally:
                r.close()
            if int(m["port"]) != self.master_port or m["is_sdown"] or m["is_odown"] or m["num-other-sentinels"] < 2:
                return False
            if not any(int(x["port"]) == self.replica_port and not x["is_sdown"]
                       and x.get("master-link-status") == "ok" for x in replicas):
                return False
        return True

    def wait_healthy(self, timeout: float) -> None:
        wait_for(self._healthy, timeout, interval=0.2, what="sentinels to see master, replica and each other")

    def wait_failover(self, old_port: int, timeout: float = 60) -> int:
        """Until a sentinel names a new master (observed); then the new master's port,
        once that node really answers as master."""
        def new_master():
            for port in self.sentinel_ports:
                addr = self.master_addr(port)
                if addr and addr[1] != old_port:
                    return addr[1]
            return None

        port = wait_for(new_master, timeout, interval=0.1, what="a sentinel to report the new master")

        def is_master():
            r = redis.Redis(port=port, socket_timeout=5)
            try:
                return r.info("replication")["role"] == "master"
            finally:
                r.close()

        wait_for(is_master, timeout, interval=0.1, what="the promoted replica to answer as master")
        self.master_port, self.replica_port = port, old_port
        return port

    def env(self) -> dict[str, str]:
        """The INFERQ_* settings of a process in sentinel mode."""
        return {"INFERQ_REDIS_MODE": "sentinel",
                "INFERQ_REDIS_SENTINELS": ",".join(f"127.0.0.1:{p}" for p in self.sentinel_ports),
                "INFERQ_REDIS_SENTINEL_MASTER": SERVICE,
                # Only credentials/db/scheme are read from the URL in sentinel mode.
                "INFERQ_REDIS_URL": f"redis://{SERVICE}/0"}

    def settings(self, **over):
        from inferq.producer.settings import ProducerSettings

        env = self.env()
        return ProducerSettings(redis_mode="sentinel", redis_sentinels=env["INFERQ_REDIS_SENTINELS"],
                                redis_sentinel_master=SERVICE, redis_url=env["INFERQ_REDIS_URL"], **over)


@pytest.fixture
def sentinel_deployment(tmp_path):
    why = _sentinel_support()
    if why:
        pytest.skip(why)
    d = SentinelDeployment(tmp_path).start()
    yield d
    d.stop()
