"""A real Redis Cluster for the tests: 3 masters + 3 replicas on free loopback
ports, each a redis-server process in the test's tmp dir, joined with
``redis-cli --cluster create``. A small cluster-node-timeout makes a failover
take a few seconds; every wait is on something observed (CLUSTER INFO / NODES
answers), with a timeout.

(Named redis_cluster.py, not cluster.py: a ``tests/cluster.py`` module would be
shadowed by the ``tests/cluster/`` test package.)
"""
from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import redis
from redis.crc import key_slot

from tests.conftest import free_port, redis_server_binary

HOST = "127.0.0.1"
ALL_SLOTS = 16384


@dataclass
class Node:
    port: int
    bus_port: int
    proc: subprocess.Popen
    dir: Path
    log: Any  # the open log file, closed at stop

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None


def cluster_support() -> Optional[str]:
    """None when this machine can run the cluster, else why not (a skip reason)."""
    binary = redis_server_binary()
    out = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=10).stdout
    if "v=" not in out:
        return f"{binary} does not report a version"
    major = int(out.split("v=")[1].split(".")[0])
    if major < 7:  # cluster-port (the bus port chosen apart from port+10000) is 7.0+
        return f"{binary} is Redis {major}.x; the cluster tests need 7.0 or newer"
    if not _redis_cli():
        return "no redis-cli on PATH (it builds the cluster)"
    return None


def _redis_cli() -> Optional[str]:
    beside = Path(redis_server_binary()).with_name("redis-cli")
    return str(beside) if beside.exists() else shutil.which("redis-cli")


def _free_port_pair() -> tuple[int, int]:
    # The bus port is set with cluster-port: port+10000 may be past 65535 or taken.
    a = free_port()
    b = free_port()
    while b == a:
        b = free_port()
    return a, b


def _wait_port(port: int, proc: subprocess.Popen, timeout: float = 10) -> None:
    end = time.time() + timeout
    while time.time() < end:
        if proc.poll() is not None:
            raise RuntimeError(f"redis-server for port {port} exited with {proc.returncode}")
        try:
            with socket.create_connection((HOST, port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"nothing listening on {port}")


def wait_until(pred, timeout: float, interval: float = 0.1, what: str = "condition"):
    from tests.service.conftest import wait_for  # the one polling helper of the tests

    return wait_for(pred, timeout, interval, what)


class RedisClusterDeployment:
    """Start with ``start()``, stop with ``stop()`` (kills what is left)."""

    def __init__(self, tmp: Path, masters: int = 3, replicas: int = 1, node_timeout_ms: int = 1000,
                 password: Optional[str] = None):
        self.tmp = tmp
        self.binary = redis_server_binary()
        self.n_masters, self.n_replicas = masters, replicas
        self.node_timeout_ms = node_timeout_ms
        self.password = password
        self.nodes: dict[int, Node] = {}

    # -- processes ---------------------------------------------------------
    def _start_node(self) -> Node:
        port, bus = _free_port_pair()
        d = self.tmp / f"node-{port}"
        d.mkdir()
        args = [self.binary, "--port", str(port), "--cluster-port", str(bus), "--bind", HOST, "--dir", str(d),
                "--cluster-enabled", "yes", "--cluster-config-file", str(d / "nodes.conf"),
                "--cluster-node-timeout", str(self.node_timeout_ms),
                "--save", "", "--appendonly", "no", "--maxmemory-policy", "noeviction",
                # A replica syncs at once (default: wait 5 s for more replicas); one
                # that never synced may not be promoted.
                "--repl-diskless-sync-delay", "0"]
        if self.password:
            args += ["--requirepass", self.password, "--masterauth", self.password]
        log = open(d / "log", "wb")
        proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
        node = Node(port, bus, proc, d, log)
        self.nodes[port] = node
        _wait_port(port, proc)
        return node

    def start(self) -> "RedisClusterDeployment":
        try:
            for _ in range(self.n_masters * (1 + self.n_replicas)):
                self._start_node()
            self._create()
            self.wait_healthy(60)
        except BaseException:
            self.stop()
            raise
        return self

    def _create(self) -> None:
        cmd = [_redis_cli(), "--cluster", "create", *(f"{HOST}:{p}" for p in self.nodes),
               "--cluster-replicas", str(self.n_replicas), "--cluster-yes"]
        if self.password:
            cmd[1:1] = ["--no-auth-warning", "-a", self.password]
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
        if out.returncode != 0:
            raise RuntimeError(f"redis-cli --cluster create failed:\n{out.stdout}\n{out.stderr}")

    def stop(self) -> None:
        for node in self.nodes.values():
            if node.alive:
                node.proc.kill()  # nothing to keep: no persistence
        for node in self.nodes.values():
            try:
                node.proc.wait(10)
            except subprocess.TimeoutExpired:
                pass
            node.log.close()

    # -- observation ---------------------------------------------------------
    def client(self, port: int) -> redis.Redis:
        """A plain (non-cluster) connection to one node, for inspecting it."""
        return redis.Redis(host=HOST, port=port, password=self.password, socket_timeout=2,
                           socket_connect_timeout=2, decode_responses=True)

    def _ask(self, port: int, *cmd):
        r = self.client(port)
        try:
            return r.execute_command(*cmd)
        except redis.RedisError:
            return None
        finally:
            r.close()

    def live_ports(self) -> list[int]:
        return [p for p, n in self.nodes.items() if n.alive]

    def node_table(self, via: Optional[int] = None) -> list[dict]:
        """CLUSTER NODES as seen by one live node: port, role, id, flags, slot
        ranges (only the nodes this deployment started)."""
        raw = None
        for port in ([via] if via else self.live_ports()):
            raw = self._ask(port, "CLUSTER", "NODES")
            if raw:
                break
        rows = []
        for line in (raw or "").splitlines():
            parts = line.split()
            addr, flags = parts[1], parts[2].split(",")
            port = int(addr.split("@")[0].rsplit(":", 1)[1])
            role = "master" if "master" in flags else "replica"
            slots = [tuple(map(int, s.split("-"))) if "-" in s else (int(s), int(s))
                     for s in parts[8:] if not s.startswith("[")]
            rows.append({"port": port, "id": parts[0], "role": role, "flags": flags, "slots": slots,
                         "master_id": None if parts[3] == "-" else parts[3]})
        return rows

    @property
    def node_list(self) -> list[dict]:
        """Every node: port, role and failed (as the cluster sees it now), pid,
        alive (the process)."""
        rows = {row["port"]: row for row in self.node_table()}
        return [{"port": p, "role": rows[p]["role"] if p in rows else "unknown",
                 "failed": p in rows and "fail" in rows[p]["flags"], "pid": n.pid, "alive": n.alive}
                for p, n in self.nodes.items()]

    def master_of_slot(self, slot: int) -> int:
        """The port of the healthy master serving ``slot`` right now."""
        for row in self.node_table():
            if row["role"] == "master" and "fail" not in row["flags"] and "fail?" not in row["flags"] \
                    and any(a <= slot <= b for a, b in row["slots"]):
                return row["port"]
        raise LookupError(f"no healthy master serves slot {slot}")

    def _state_ok(self, port: int) -> bool:
        info = self._ask(port, "CLUSTER", "INFO")
        if not info:
            return False
        fields = dict(line.split(":", 1) for line in info.splitlines() if ":" in line)
        return (fields.get("cluster_state") == "ok" and int(fields.get("cluster_slots_ok", 0)) == ALL_SLOTS
                and int(fields.get("cluster_slots_pfail", 0)) == 0 and int(fields.get("cluster_slots_fail", 0)) == 0)

    def _replica_synced(self, port: int) -> bool:
        info = self._ask(port, "INFO", "replication")  # parsed by redis-py into a dict
        return bool(info) and info.get("master_link_status") == "up"

    def _healthy(self) -> bool:
        """Every live node says cluster_state:ok with all slots served, as many
        masters as we asked for, and every live replica has synced with its
        master (a replica that never did cannot be promoted)."""
        live = self.live_ports()
        if not all(self._state_ok(p) for p in live):
            return False
        table = self.node_table()
        masters = [r for r in table if r["role"] == "master" and r["slots"] and not {"fail", "fail?"} & set(r["flags"])]
        replicas = [r["port"] for r in table if r["role"] == "replica" and r["port"] in live]
        return len(masters) == self.n_masters and all(self._replica_synced(p) for p in replicas)

    def wait_healthy(self, timeout: float = 60) -> None:
        wait_until(self._healthy, timeout, what="every node to report cluster_state:ok with all slots")

    # -- faults ----------------------------------------------------------------
    def kill_master_of_slot(self, slot: int) -> int:
        """SIGKILL the master serving ``slot``; its port."""
        port = self.master_of_slot(slot)
        node = self.nodes[port]
        node.proc.send_signal(signal.SIGKILL)
        node.proc.wait(10)
        return port

    def kill_master_of_key(self, key: str | bytes) -> int:
        return self.kill_master_of_slot(key_slot(key.encode() if isinstance(key, str) else key))

    def wait_failover(self, slot: int, timeout: float = 60) -> int:
        """Until a replica has been promoted for ``slot`` and every live node
        says cluster_state:ok; the new master's port."""
        def promoted():
            try:
                port = self.master_of_slot(slot)
            except LookupError:
                return None
            return port if self.nodes[port].alive else None

        port = wait_until(promoted, timeout, what=f"a live master for slot {slot}")
        wait_until(lambda: all(self._state_ok(p) for p in self.live_ports()), timeout,
                   what="cluster_state:ok on every live node after the failover")
        return port

    # -- what the code under test reads ------------------------------------------
    def seed_urls(self, n: int = 2) -> list[str]:
        auth = f":{self.password}@" if self.password else ""
        return [f"redis://{auth}{HOST}:{p}" for p in list(self.nodes)[:n]]

    @property
    def url(self) -> str:
        """INFERQ_REDIS_URL for cluster mode: comma-separated seeds."""
        return ",".join(self.seed_urls())

    def env(self) -> dict[str, str]:
        return {"INFERQ_REDIS_MODE": "cluster", "INFERQ_REDIS_URL": self.url}
