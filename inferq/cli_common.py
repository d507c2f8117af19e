"""Shared bits of the CLI commands: consoles, the Producer, friendly errors."""
from __future__ import annotations

import functools

from rich.console import Console

out = Console(highlight=False, soft_wrap=True)
err = Console(stderr=True, highlight=False)


def friendly_errors(fn):
    """Turn the errors a user can fix into one red line and exit code 1."""

    @functools.wraps(fn)
    def wrapper(*a, **kw):
        import redis

        from inferq.producer.errors import InferqError
        from inferq.producer.settings import ProducerSettings

        try:
            return fn(*a, **kw)
        except InferqError as e:
            err.print(f"[red]error:[/red] {e}")
        except redis.exceptions.AuthenticationError as e:
            err.print(f"[red]error:[/red] Redis refused the credentials: {e}")
        except redis.exceptions.ConnectionError as e:
            url = ProducerSettings().safe_url()
            err.print(f"[red]error:[/red] cannot reach Redis at {url} ({e}); start one with `inferq up` "
                      "or set INFERQ_REDIS_URL")
        except ValueError as e:
            err.print(f"[red]error:[/red] {e}")
        return 1

    return wrapper


def producer():
    from inferq.producer import Producer

    return Producer()
