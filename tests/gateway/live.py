"""The live gateway tests' set-up: gateway processes, the client, and bounded waits.

The fixtures built on these are in conftest.py beside this file: ``gateway_server``
(a gateway of the test's own, with the module's ``gateway_settings``),
``start_gateway`` (one with settings of a single test's own) and ``upstreams``.

Why a process per test, and none shared by a module: a gateway keeps for its
whole life what it loaded and what it counted, and nothing resets them between
tests. It loads the routing table and keys on its first request and then reloads
on a doorbell or its periodic refresh (a minute apart in test_gateway_errors),
so a process kept from the test before would answer 404 for this test's models,
or send their requests to that test's stopped upstreams; and /metrics' counters
(requests by model and status, prefix routes) would hold that test's counts. A
sync step before each test's first request (ring, wait for the reload) would make
every test pass even where the gateway never heard a change, which is what
several of them check. So the pool below keeps each test's process fresh and
takes only the wait for it to start off the test's time.
"""

import json
import threading
import urllib.error
import urllib.request
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import openai

from tests.processes import LiveServer, start_web, wait_for

# Refreshes a fraction of a second apart: a test sees a change without a doorbell.
FAST_REFRESH = {
    "LLMGW_GATEWAY_KEYS_REFRESH_S": "0.5",
    "LLMGW_GATEWAY_REFRESH_S": "0.5",
    "LLMGW_GATEWAY_LAST_USED_FLUSH_S": "0.5",
    "LLMGW_GATEWAY_ENGINE_SCRAPE_S": "0.3",
}


def client(server, secret, **kw) -> openai.OpenAI:
    """The unmodified openai client on ``server``'s gateway; it never retries by itself."""
    return openai.OpenAI(base_url=server.url + "/v1", api_key=secret, max_retries=0, **kw)


def post(server, path: str, body, secret=None) -> tuple[int, object, bytes]:
    """POST ``body`` (bytes as they are, anything else as JSON) to ``server``; (status,
    headers, body bytes), whatever the status."""
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    headers = {"Content-Type": "application/json"}
    if secret:
        headers["Authorization"] = f"Bearer {secret}"
    req = urllib.request.Request(server.url + path, data=data, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, resp.headers, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers, exc.read()


def wait_until(check, timeout=10.0, what="condition"):
    """Poll a condition a user would wait for; bounded, never a timed assertion
    (``tests.processes.wait_for``, polled every 50 ms)."""
    return wait_for(check, what, timeout=timeout, interval=0.05)


class GatewayPool:
    """Fresh gateway processes (the web process as users run it, ``llmgw_site.serve``,
    on the test database), each one started while the test before it runs.

    ``take(settings)`` hands out the process started ahead for these settings (or
    starts one) and starts the next one in the background. A process started ahead
    has not touched the database or Redis before its first request, so it sees only
    what its own test writes. The last one started ahead for each settings is
    stopped by ``close``.
    """

    def __init__(self, log_dir: Path):
        self.log_dir = log_dir
        self._ahead: dict[tuple, Future] = {}
        self._lock = threading.Lock()
        self._starter = ThreadPoolExecutor(max_workers=1, thread_name_prefix="gateway-ahead")

    def _start(self, settings: dict) -> LiveServer:
        return start_web(self.log_dir, **settings)

    def take(self, settings: dict) -> LiveServer:
        key = tuple(sorted(settings.items()))
        with self._lock:
            ahead = self._ahead.pop(key, None)
        server = None
        if ahead is not None:
            try:
                server = ahead.result()
            except RuntimeError:  # it did not start; its log is kept in log_dir
                server = None
        if server is None or server.proc.poll() is not None:
            # None started ahead, or it died waiting: one now, which fails the test if
            # it does not start either.
            server = self._start(settings)
        with self._lock:
            self._ahead[key] = self._starter.submit(self._start, settings)
        return server

    def close(self) -> None:
        with self._lock:
            ahead, self._ahead = list(self._ahead.values()), {}
        for future in ahead:
            try:
                future.result().stop()
            except Exception:  # noqa: BLE001 - one that failed to start has nothing to stop
                pass
        self._starter.shutdown()
