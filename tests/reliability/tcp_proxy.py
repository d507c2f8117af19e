"""A loopback TCP proxy that can stall: the network partition of the fencing
tests. While paused, bytes already sent are held (not dropped) and delivered
on resume, like a link that stops forwarding for a while and then recovers;
connections stay open, so neither side sees an error unless its own timeout
fires."""
from __future__ import annotations

import socket
import threading
from typing import Optional


class StallingProxy:
    def __init__(self, target_port: int, target_host: str = "127.0.0.1"):
        self.target = (target_host, target_port)
        self._listener = socket.socket()
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(64)
        self.port = self._listener.getsockname()[1]
        self._open = threading.Event()
        self._open.set()
        self._closed = False
        self._socks: list[socket.socket] = []
        self._lock = threading.Lock()
        self.forwarded_while_open = 0
        threading.Thread(target=self._accept, name="proxy-accept", daemon=True).start()

    def url(self, password: Optional[str] = None, db: int = 0) -> str:
        auth = f":{password}@" if password else ""
        return f"redis://{auth}127.0.0.1:{self.port}/{db}"

    def pause(self) -> None:
        """Stop forwarding in both directions (data is held, not lost)."""
        self._open.clear()

    def resume(self) -> None:
        self._open.set()

    def close(self) -> None:
        self._closed = True
        self._open.set()
        try:
            self._listener.close()
        except OSError:
            pass
        with self._lock:
            for s in self._socks:
                try:
                    s.close()
                except OSError:
                    pass

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.target, timeout=5)
                upstream.settimeout(None)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._socks += [client, upstream]
            for src, dst in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(src, dst), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                self._open.wait()  # a stall holds the bytes here
                if self._closed:
                    break
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
