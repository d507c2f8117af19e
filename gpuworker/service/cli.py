"""``python -m inferq.gpuworker.service`` / ``inferq worker``: flags override INFERQ_* env."""
from __future__ import annotations

import argparse
import sys
import typing
from typing import Optional

from pydantic import ValidationError

# Secrets never become flags: a command line is visible to every local user (ps).
NOT_FLAGS = frozenset({"redis_password", "redis_sentinel_password"})


def _flag_type(annotation):
    """(type, choices) from a field annotation: Optional[int] -> (int, None),
    Literal["a", "b"] -> (str, ["a", "b"])."""
    if typing.get_origin(annotation) is typing.Literal:
        choices = list(typing.get_args(annotation))
        return type(choices[0]), choices
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    return (_flag_type(args[0]) if args else (annotation, None))


def parser() -> argparse.ArgumentParser:
    """One flag per WorkerSettings field: --max-num-seqs for max_num_seqs, typed
    like the field, with its description as help (booleans get --x/--no-x)."""
    from inferq.gpuworker.service.settings import WorkerSettings

    p = argparse.ArgumentParser(prog="inferq worker", description="Run an inferq GPU worker on a Redis job stream.")
    for name, field in WorkerSettings.model_fields.items():
        if name in NOT_FLAGS:
            continue
        flag = "--" + name.replace("_", "-")
        help_ = f"{field.description or ''} (env INFERQ_{name.upper()})".strip()
        typ, choices = _flag_type(field.annotation)
        if typ is bool:
            p.add_argument(flag, dest=name, action=argparse.BooleanOptionalAction, default=None, help=help_)
        else:
            p.add_argument(flag, dest=name, type=typ, choices=choices, default=None, help=help_)
    return p


def main(argv: Optional[list[str]] = None) -> int:
    args = parser().parse_args(argv)
    from inferq.gpuworker.logging import configure
    from inferq.gpuworker.service.settings import WorkerSettings

    given = {k: v for k, v in vars(args).items() if v is not None}
    try:
        settings = WorkerSettings(**given)
    except ValidationError as e:
        print(f"inferq worker: invalid configuration:\n{e}", file=sys.stderr)
        return 2
    configure(settings.log_level, settings.log_json)
    from inferq.gpuworker.service.device_check import DeviceUnusable
    from inferq.gpuworker.service.identity import WorkerIdInUse
    from inferq.gpuworker.service.worker import Worker

    import redis

    worker = Worker(settings)
    try:
        return worker.run()
    except (WorkerIdInUse, DeviceUnusable) as e:
        print(f"inferq worker: {e}", file=sys.stderr)
        return 2
    except redis.AuthenticationError as e:
        print(f"inferq worker: Redis refused the credentials ({e}); check INFERQ_REDIS_URL / INFERQ_REDIS_PASSWORD",
              file=sys.stderr)
        return 1
    except redis.ConnectionError as e:
        print(f"inferq worker: cannot reach Redis at {settings.safe_dump()['redis_url']}: {e}", file=sys.stderr)
        return 1
