"""The gateway's command-line flags, shared by `inferq gateway` and
`python -m inferq.producer.gateway`."""
from __future__ import annotations

import argparse


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--host", default=None)
    p.add_argument("--port", type=int, default=None)
    p.add_argument("--log-level", default="info")


def run(args) -> int:
    from inferq.producer.gateway import serve
    from inferq.producer.gateway.config import GatewaySettings

    overrides = {k: v for k, v in (("host", args.host), ("port", args.port)) if v is not None}
    serve(GatewaySettings(**overrides), log_level=args.log_level)
    return 0
