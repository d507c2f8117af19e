"""A real stack for the serve benchmark: redis-server + a worker process on a
tiny random Llama (shared with the gateway tests when both run)."""
from __future__ import annotations

import pytest

from tests.gateway.stack import TINY, shared_stack, stop_shared_stack


@pytest.fixture(scope="session")
def bench_stack(tmp_path_factory):
    s = shared_stack(tmp_path_factory)
    yield s
    stop_shared_stack()


@pytest.fixture(scope="session")
def tiny_model_name():
    return TINY


@pytest.fixture(scope="session")
def tiny_model_folder(tmp_path_factory):
    from tests.tiny_models import save_tiny_model

    return save_tiny_model("llama", tmp_path_factory.mktemp("bench-tiny") / "llama")
