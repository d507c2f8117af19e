"""A webhook receiver for the webhook tests, run as its own process:
``python -m tests.gateway.webhook_receiver PORT SECRET_FILE LOG [fail|hold]``.

Every POST is checked with the official SDK, ``OpenAI(webhook_secret=...).webhooks.unwrap``
with the endpoint's secret, read from SECRET_FILE (written once the endpoint is registered);
a delivery that passes is appended to LOG as one JSON line (webhook-id, event id,
type, data id) and answered 200, one that does not is answered 400 (the sender
retries it and, in the end, dead-letters it). With ``fail`` every POST is answered
500 (an endpoint that is permanently broken); with ``hold`` a verified delivery is
logged and then never answered (the sender is stuck mid-delivery, e.g. to be killed).
"""
from __future__ import annotations

import json
import sys
import threading
from pathlib import Path
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import openai


def main() -> None:
    port, secret_file, log_path = int(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
    mode = sys.argv[4] if len(sys.argv) > 4 else ""
    failing, holding = mode == "fail", mode == "hold"
    lock = threading.Lock()
    log = open(log_path, "a", encoding="utf-8")

    clients: dict[str, openai.OpenAI] = {}

    def client_for(secret: str) -> openai.OpenAI:
        with lock:
            if secret not in clients:
                clients[secret] = openai.OpenAI(api_key="unused", webhook_secret=secret or None)
            return clients[secret]

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            body = self.rfile.read(int(self.headers.get("content-length") or 0))
            if failing:
                return self._answer(500, b"receiver is broken on purpose")
            try:
                event = client_for(secret_file.read_text().strip() if secret_file.exists() else "").webhooks.unwrap(
                    body, dict(self.headers.items()))
            except Exception as e:  # a bad signature, a stale timestamp, a missing header
                return self._answer(400, f"{type(e).__name__}: {e}".encode())
            line = {"webhook_id": self.headers["webhook-id"], "id": event.id, "type": event.type,
                    "data_id": event.data.id, "created_at": event.created_at, "body": body.decode()}
            with lock:
                log.write(json.dumps(line) + "\n")
                log.flush()
            if holding:
                threading.Event().wait()  # never answers: the process is killed with the request open
            self._answer(200, b"ok")

        def _answer(self, status: int, text: bytes) -> None:
            self.send_response(status)
            self.send_header("content-length", str(len(text)))
            self.end_headers()
            try:
                self.wfile.write(text)
            except BrokenPipeError:
                pass  # the sender gave up waiting; it retries with the same webhook-id

        def log_message(self, *args) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    print("ready", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
