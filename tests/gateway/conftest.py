"""Fixtures of the live gateway tests (test_gateway_live, test_gateway_errors,
test_prefix_live): a gateway of each test's own, and upstreams on loopback.

A module sets its gateway's environment by overriding ``gateway_settings``; a test
that needs settings of its own alone uses ``start_gateway``. Modules using these
say ``pytestmark = [pytest.mark.live, pytest.mark.django_db(transaction=True)]``:
the processes read what the test commits. tests/gateway/live.py says why each
test gets a fresh process rather than one shared by its module.
"""

import pytest

from tests.gateway.helpers import Upstream
from tests.gateway.live import FAST_REFRESH, GatewayPool
from tests.processes import start_web


@pytest.fixture(scope="session")
def gateway_pool(tmp_path_factory):
    pool = GatewayPool(tmp_path_factory.mktemp("gateways"))
    yield pool
    pool.close()


@pytest.fixture
def gateway_settings() -> dict:
    """The environment of the module's gateway (``LLMGW_GATEWAY_*``); override per module."""
    return FAST_REFRESH


@pytest.fixture
def gateway_server(transactional_db, gateway_settings, gateway_pool):
    """A gateway process of this test's own (``llmgw_site.serve``), started while the test
    before ran."""
    server = gateway_pool.take(gateway_settings)
    yield server
    server.stop()


@pytest.fixture
def start_gateway(transactional_db, tmp_path):
    """``start_gateway(**settings)``: a gateway with settings this test alone needs,
    started when asked; stopped at the test's end."""
    started = []

    def start(**settings):
        started.append(start_web(tmp_path, **settings))
        return started[-1]

    yield start
    for server in started:
        server.stop()


@pytest.fixture
def upstreams():
    """``upstreams(name, mode=..., token_delay=...)``: an OpenAI-shaped engine on
    loopback (tests.gateway.helpers.Upstream); all stopped at the test's end."""
    made = []

    def make(*args, **kwargs):
        made.append(Upstream(*args, **kwargs))
        return made[-1]

    yield make
    for up in made:
        up.stop()
