"""Everything in the tests that starts a real process: the web process (uvicorn), a
Celery worker and beat,
agentd, the fake engine, and the whole stack for tests/e2e/.

A test that uses anything here is ``live`` (see tests/conftest.py) and stays out of
``make test-fast``. Each module holds one kind of process; add a new kind beside
them and export it here.

- ``base``: the repository root, the test database's environment, ports, waits;
- ``servers``: the web process (``start_web``: ``llmgw_site.serve`` on uvicorn;
  static files collected first), Celery, the fake engine;
- ``agents``: an agentd process and its config;
- ``stack``: all of them together, with a private Redis, for the e2e scenarios;
- ``postgres``: a PostgreSQL server of a test's own, which it may stop (imported
  from ``tests.processes.postgres``);
- ``load``: a steady load of chat completions through the gateway, each outcome kept;
- ``tls``: a CA and certificates made by the test, and HAProxy checking clients' ones
  (imported from ``tests.processes.tls``: it needs the ``cryptography`` package);
- ``browser``: Debian's headless Chromium under its chromedriver, for tests/browser/.
"""

from tests.processes.agents import AgentProcess, start_agent, wait_until, write_config
from tests.processes.base import (
    ROOT,
    free_port,
    pid_alive,
    port_block,
    subprocess_env,
    tails,
    wait_for,
    wait_for_port,
)
from tests.processes.browser import missing_browser, start_chromium
from tests.processes.load import Load, Outcome
from tests.processes.servers import (
    FakeEngine,
    LiveServer,
    collect_static,
    start_asgi,
    start_celery,
    start_uvicorn,
    start_web,
    stop_all,
)
from tests.processes.stack import FAST, TENTH, Agent, Stack

__all__ = [
    "FAST",
    "ROOT",
    "Agent",
    "AgentProcess",
    "FakeEngine",
    "LiveServer",
    "Load",
    "Outcome",
    "Stack",
    "TENTH",
    "collect_static",
    "free_port",
    "missing_browser",
    "pid_alive",
    "port_block",
    "start_agent",
    "start_asgi",
    "start_celery",
    "start_chromium",
    "start_uvicorn",
    "start_web",
    "stop_all",
    "subprocess_env",
    "tails",
    "wait_for",
    "wait_for_port",
    "wait_until",
    "write_config",
]
