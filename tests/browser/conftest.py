"""Fixtures for the browser tier: one headless Chromium for the whole run, and one live stack
per module (Daphne, a Celery worker and beat, one agent serving the tiny model).

- ``browser`` (session): the run's Chromium, a ``tests.browser.helpers.Browser``;
- ``live_fleet`` (module): the stack, its node and its model, with an admin login;
- ``signed_in`` (module): ``browser`` pointed at ``live_fleet`` and logged in as its admin.

Every test that uses the browser is checked at its end as each visit is: no console
error and no failed request since it started, whatever it clicked.

The stack lives for a whole module, longer than a test's database transaction, so
it writes with the database unblocked rather than through ``transactional_db``
(whose flush after each test would take the stack's node and keys with it); the
module's teardown flushes the tables instead, leaving the next test an empty database.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.browser.helpers import Browser
from tests.processes import Agent, Stack, start_chromium

NODE_ID = "browser-node"
MODEL = "tiny-llama"
ADMIN = ("operator", "a-password-for-browser-tests")


@dataclass
class LiveFleet:
    """The module's running stack, with what the tests look for in its pages."""

    stack: Stack
    agent: Agent
    node_id: str
    model: str
    username: str
    password: str

    @property
    def url(self) -> str:
        return self.stack.url


@pytest.fixture(scope="session")
def browser(tmp_path_factory):
    b = Browser(start_chromium(tmp_path_factory.mktemp("chromium") / "chromedriver.log"))
    yield b
    b.quit()


@pytest.fixture(scope="session")
def browser_test_database(request, django_db_setup, django_db_blocker):
    """The test database, set up here when no other test of the run asked pytest-django for it.

    pytest-django creates the test database only for a run that holds a test
    marked ``django_db`` (or using ``db``); ``pytest tests/browser`` alone holds
    none, and the stack must never write to (or flush) the real database.
    """
    from django.db import connection
    from django.test.utils import setup_databases, teardown_databases
    from pytest_django.fixtures import _get_databases_for_setup

    aliases, _ = _get_databases_for_setup(request.session.items)
    config = None
    with django_db_blocker.unblock():
        if "default" not in aliases:
            config = setup_databases(verbosity=0, interactive=False, aliases={"default"})
        name = Path(str(connection.settings_dict["NAME"])).name
        assert "test" in name, f"the browser tests would write to {name}, not a test database"
    yield
    if config is not None:
        with django_db_blocker.unblock():
            teardown_databases(config, verbosity=0)


@pytest.fixture(scope="module")
def live_fleet(browser_test_database, django_db_blocker, tmp_path_factory):
    """Daphne, Celery, one agent, and the tiny model ready and answering through the gateway."""
    from django.contrib.auth import get_user_model
    from django.core.management import call_command

    from agentd.tinygguf import write as write_tiny_model
    from tests.e2e.helpers import apply_model, wait_serving

    tmp = tmp_path_factory.mktemp("live-fleet")
    with django_db_blocker.unblock():
        stack = Stack(tmp)
        # A history point a second (15 s by default), so a node page's charts have a
        # line within seconds of the stack starting.
        stack.env["LLMGW_HISTORY_STEP_S"] = "1"
        try:
            stack.make_keys()
            get_user_model().objects.create_superuser(ADMIN[0], password=ADMIN[1])
            stack.start_control_plane()
            agent = stack.add_agent(NODE_ID)
            apply_model(stack, write_tiny_model(tmp / "weights" / "tiny-llama.gguf"), MODEL)
            wait_serving(stack, MODEL)
            yield LiveFleet(stack, agent, NODE_ID, MODEL, *ADMIN)
        finally:
            stack.close()
            call_command("flush", interactive=False, verbosity=0)


@pytest.fixture(scope="module")
def signed_in(browser, live_fleet):
    """The browser on the module's stack, logged in through the admin's form as a superuser."""
    browser.use(live_fleet.url)
    browser.log_in(live_fleet.username, live_fleet.password)
    yield browser
    browser.leave()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    if report.when == "call":
        item.browser_call_failed = report.failed
    return report


@pytest.fixture(autouse=True)
def _page_problems(request, tmp_path):
    """No console error and no failed request during the test; a screenshot when it failed."""
    if "browser" not in request.fixturenames:
        yield
        return
    browser: Browser = request.getfixturevalue("browser")
    browser.forget_problems()
    yield
    if getattr(request.node, "browser_call_failed", False):
        shot = tmp_path / "failure.png"
        browser.driver.save_screenshot(str(shot))
        print(f"\nscreenshot of the page at the failure: {shot}")
        return
    browser.check_page()
