import os
from pathlib import Path

import pytest

# Fixtures that start real processes: a test using one is `live` whether or not
# its module says so (tests/processes/ holds what they start).
PROCESS_FIXTURES = {"live_web", "stack", "stack_on_postgres", "postgres"}
E2E_DIR = Path(__file__).parent / "e2e"
# The browser tier (tests/browser): headless Chromium over a live stack, `browser` and `live`.
BROWSER_DIR = Path(__file__).parent / "browser"


def pytest_configure(config):
    config.pluginmanager.register(_BrowserGate(), "llmgw-browser-gate")
    # What the generated security walks covered, in the run's summary: registered here,
    # as under xdist the run's own process loads no conftest below tests/.
    config.pluginmanager.import_plugin("tests.security.summary")
    # A channel-layer prefix of this run's own, so test runs sharing a Redis
    # (CI's, or several at once on one machine) never hear each other's groups.
    from django.conf import settings

    prefix = f"llmgw-test-{os.getpid()}"
    os.environ["LLMGW_CHANNEL_PREFIX"] = prefix  # for the processes tests start
    settings.CHANNEL_LAYERS["default"]["CONFIG"]["prefix"] = prefix
    # With DEBUG off, llmgw_site.asgi refuses to start without ALLOWED_HOSTS; tests
    # import it, and the web processes they start serve on loopback.
    if not settings.ALLOWED_HOSTS:
        os.environ["ALLOWED_HOSTS"] = "127.0.0.1,localhost,testserver"
        settings.ALLOWED_HOSTS = os.environ["ALLOWED_HOSTS"].split(",")
    # Pages rendered in this process name static files through the plain storage:
    # the production one needs `collectstatic`'s manifest, which only the web processes
    # tests start are given (tests.processes.collect_static), as they serve the files.
    settings.STORAGES = {
        **settings.STORAGES,
        "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
    }
    # The embedded default: a private Redis, started for the run when the
    # environment names none (`make test` on a fresh machine).
    if not os.environ.get("REDIS_URL"):
        from fleet.devstack.redis import PrivateRedis

        config._llmgw_redis = PrivateRedis().start()


def pytest_collection_modifyitems(config, items):
    """Mark the end-to-end and browser tiers, and every test a process-starting fixture makes live.

    Modules whose tests start processes themselves say ``pytestmark = pytest.mark.live``;
    ``make test-fast`` runs ``-m "not live and not e2e"``. On a machine without
    Chromium and its driver the browser tests are deselected, and the run's summary
    says so and how to install them (``pytest_terminal_summary``): never a quiet skip.
    """
    # Under xdist, tests/ordering.py then deals them to the workers.
    for item in items:
        if E2E_DIR in item.path.parents:
            item.add_marker(pytest.mark.e2e)
            item.add_marker(pytest.mark.live)
        elif BROWSER_DIR in item.path.parents:
            item.add_marker(pytest.mark.browser)
            item.add_marker(pytest.mark.live)
        elif PROCESS_FIXTURES.intersection(item.fixturenames):
            item.add_marker(pytest.mark.live)


class _BrowserGate:
    """Runs after ``-m`` has deselected (trylast): ``make test-fast`` never asked for them."""

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, config, items):
        _deselect_browser_tests_without_a_browser(config, items)


def _deselect_browser_tests_without_a_browser(config, items):
    from tests.processes.browser import missing_browser

    browser_tests = [item for item in items if item.get_closest_marker("browser")]
    why = missing_browser() if browser_tests else None
    if why is None:
        return
    if os.environ.get("LLMGW_BROWSER_TESTS") == "required":  # CI (.ci/run)
        from tests.processes.browser import INSTALL_HINT

        raise pytest.UsageError(f"browser tests required, but {why}: {INSTALL_HINT}")
    config._llmgw_browser_skipped = (len(browser_tests), why)
    config.hook.pytest_deselected(items=browser_tests)
    items[:] = [item for item in items if not item.get_closest_marker("browser")]


def pytest_terminal_summary(terminalreporter, config):
    skipped = getattr(config, "_llmgw_browser_skipped", None)
    if skipped is None:
        return
    from tests.processes.browser import INSTALL_HINT

    count, why = skipped
    terminalreporter.write_sep("!", "BROWSER TESTS NOT RUN", red=True, bold=True)
    terminalreporter.write_line(
        f"{count} browser tests (tests/browser) were left out: {why}. "
        f"Install them with `{INSTALL_HINT}` (as root) and run again.",
        red=True,
        bold=True,
    )


def pytest_unconfigure(config):
    redis = getattr(config, "_llmgw_redis", None)
    if redis is not None:
        redis.stop()


@pytest.fixture(autouse=True)
def _fresh_channel_layer():
    """Each test gets channel-layer connections of its own event loop."""
    from channels.layers import channel_layers

    channel_layers.backends.clear()
    yield
    channel_layers.backends.clear()


@pytest.fixture
def live_web(transactional_db, tmp_path):
    """The web process as users run it (``llmgw_site.serve``, uvicorn) on a free loopback
    port and the test database."""
    from tests.processes import start_web

    server = start_web(tmp_path)
    yield server
    server.stop()
