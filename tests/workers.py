"""Each pytest-xdist worker gets a state dir and a Redis database of its own.

`make test` runs the suite in parallel processes (pytest-xdist): most of the live
and e2e tiers wait on processes they started, so three workers keep two cores
busy where two left a third of their time idle. The workers share the machine's
PostgreSQL and Redis and the run's state dir, and pytest-django already gives
each its own test database; this module gives each the rest of what it would
otherwise share:

- ``LLMGW_STATE_DIR``: the run's dir plus the worker's name (``var/test/gw0``), so
  the SQLite test database, the private Redis's socket, the collected static files
  and the secret key are the worker's own. The run's dir stays in
  ``LLMGW_RUN_DIR``, where the reliability figures of every worker are gathered.
- ``REDIS_URL`` (where the environment names one): database N+1 for worker N,
  since keys such as the reconciler's lock and the gateways' load reports are
  named without the channel layer's prefix.

It is loaded with ``-p tests.workers`` (pyproject.toml's addopts): a plugin named
there is imported before pytest-django reads the settings, and xdist names the
worker (``PYTEST_XDIST_WORKER``) before that. Without xdist it changes nothing.
"""

import os
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _isolate(environ=os.environ) -> None:
    base = environ.get("LLMGW_STATE_DIR") or str(ROOT / "var" / "test")
    environ.setdefault("LLMGW_RUN_DIR", base)
    worker = environ.get("PYTEST_XDIST_WORKER")
    if not worker or environ.get("LLMGW_WORKER_ISOLATED") == worker:
        return
    environ["LLMGW_WORKER_ISOLATED"] = worker  # once, whoever imports this again
    environ["LLMGW_STATE_DIR"] = str(Path(base) / worker)
    index = int(re.sub(r"\D", "", worker) or 0)
    url = environ.get("REDIS_URL")
    if url and url.startswith(("redis://", "rediss://")):
        match = re.match(r"^(rediss?://[^/?#]*)(?:/(\d*))?(.*)$", url)
        if match is not None:
            prefix, db, rest = match.groups()
            environ["REDIS_URL"] = f"{prefix}/{int(db or 0) + 1 + index}{rest}"


_isolate()
