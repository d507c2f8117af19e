"""Standard Webhooks signatures, the scheme OpenAI signs its webhooks with.

``webhook-signature: v1,<base64 HMAC-SHA256 of "{id}.{timestamp}.{body}">``, keyed
with the base64-decoded part of the secret after ``whsec_``. The id stays the
same for every attempt of a delivery (receivers drop duplicates by it); the
timestamp is the attempt's, so a receiver's replay window accepts a late retry.
"""
from __future__ import annotations

import base64
import hashlib
import hmac
import time
from typing import Optional


def signature(secret: str, msg_id: str, timestamp: int, body: bytes) -> str:
    key = base64.b64decode(secret.removeprefix("whsec_"))
    mac = hmac.new(key, f"{msg_id}.{timestamp}.".encode() + body, hashlib.sha256)
    return "v1," + base64.b64encode(mac.digest()).decode()


def signed_headers(secret: str, msg_id: str, body: bytes, now: Optional[float] = None) -> dict[str, str]:
    timestamp = int(time.time() if now is None else now)
    return {"content-type": "application/json", "user-agent": "inferq-webhooks/1",
            "webhook-id": msg_id, "webhook-timestamp": str(timestamp),
            "webhook-signature": signature(secret, msg_id, timestamp, body)}
