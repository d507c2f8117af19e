import pytest

from tests.gateway.stack import shared_stack, stop_shared_stack


@pytest.fixture(scope="session")
def stack(tmp_path_factory):
    """The gateway tests' stack: a private redis-server and one worker serving "tiny"."""
    s = shared_stack(tmp_path_factory)
    yield s
    stop_shared_stack()
