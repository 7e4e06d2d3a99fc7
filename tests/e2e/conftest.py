"""Fixtures for the end-to-end suite: the whole stack as real processes on the test database."""

import json
import os
from datetime import UTC, datetime
from pathlib import Path

import pytest

from tests.e2e import reliability
from tests.processes import Stack
from tests.processes.postgres import PrivatePostgres


@pytest.fixture
def tiny_model(tmp_path) -> Path:
    """The generated tiny llama GGUF, served by real llama.cpp on the CPU."""
    from agentd.tinygguf import write as write_tiny_model

    return write_tiny_model(tmp_path / "weights" / "tiny-llama.gguf")


def _running(stack: Stack):
    try:
        stack.make_keys()
        stack.start_control_plane()
        yield stack
    finally:
        stack.close()


@pytest.fixture
def clock() -> dict[str, str]:
    """LLMGW_* settings over the stack's FAST clock: none here.

    A test module whose faults play out over minutes overrides this fixture,
    e.g. with ``tests.processes.TENTH`` (the real clock divided by ten).
    """
    return {}


@pytest.fixture
def stack(transactional_db, tmp_path, clock):
    """A private Redis, the web process (uvicorn, as users run it), a Celery worker and
    beat; agents are added by the test.

    Everything it started is stopped afterwards, engines included (they outlive
    their agent by design), before the test database is flushed.
    """
    yield from _running(Stack(tmp_path, **clock))


@pytest.fixture
def postgres(transactional_db):
    """A PostgreSQL server of the test's own, migrated, which it may stop and start;
    this process's ORM is on it until the test ends. Fails (never skips) naming what
    is missing where the PostgreSQL server is not installed."""
    pg = PrivatePostgres()
    try:
        pg.init()
        pg.migrate()
        with pg.as_default():
            yield pg
    finally:
        pg.close()


@pytest.fixture
def stack_on_postgres(postgres, tmp_path, clock):
    """``stack``, its control plane on the test's own PostgreSQL (``postgres``), on the
    module's ``clock`` as well."""
    yield from _running(Stack(tmp_path, database_url=postgres.url, **clock))


@pytest.fixture
def record(request, tmp_path):
    """``record(row, **figures)``: one fault's figures, printed and kept for docs/reliability.md.

    Each call appends a JSON line to ``reliability.jsonl`` in the run's state dir
    (``$LLMGW_RUN_DIR``, which tests/workers.py sets to ``$LLMGW_STATE_DIR`` before
    giving each parallel worker a dir of its own; the test's tmp dir when neither
    is set), so every worker's rows land in one file and a later run can refresh the table
    (``python -m tests.e2e.reliability``).
    """

    def write(row: str, **figures) -> dict:
        line = {
            "row": row,
            "test": request.node.nodeid,
            "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
            **figures,
        }
        text = json.dumps(line, sort_keys=False)
        print(f"\nreliability: {text}")
        run_dir = os.environ.get("LLMGW_RUN_DIR") or os.environ.get("LLMGW_STATE_DIR")
        directory = Path(run_dir or tmp_path)
        directory.mkdir(parents=True, exist_ok=True)
        with open(reliability.path(directory), "a") as fh:
            fh.write(text + "\n")
        return line

    return write
