import pytest

from tests.gateway.stack import running_gateway, shared_stack, stop_shared_stack


@pytest.fixture(scope="session")
def stack(tmp_path_factory):
    s = shared_stack(tmp_path_factory)
    yield s
    stop_shared_stack()


@pytest.fixture(scope="module")
def gateway_url(stack):
    """A gateway with default settings (no API keys)."""
    with running_gateway(stack.url) as url:
        yield url
