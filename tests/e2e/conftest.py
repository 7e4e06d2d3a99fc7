"""Fixtures for the end-to-end suite: the whole stack as real processes on the test database."""

import json
import os
from datetime import UTC, datetime
from pathlib import Path

import pytest

from tests.e2e import reliability
from tests.processes import Stack


@pytest.fixture
def tiny_model(tmp_path) -> Path:
    """The generated tiny llama GGUF, served by real llama.cpp on the CPU."""
    from fleet.devstack.tinymodel import write_tiny_model

    return write_tiny_model(tmp_path / "weights" / "tiny-llama.gguf")


@pytest.fixture
def stack(transactional_db, tmp_path):
    """A private Redis, Daphne, a Celery worker and beat; agents are added by the test.

    Everything it started is stopped afterwards, engines included (they outlive
    their agent by design), before the test database is flushed.
    """
    s = Stack(tmp_path)
    try:
        s.make_keys()
        s.start_control_plane()
        yield s
    finally:
        s.close()


@pytest.fixture
def record(request, tmp_path):
    """``record(row, **figures)``: one fault's figures, printed and kept for docs/reliability.md.

    Each call appends a JSON line to ``$LLMGW_STATE_DIR/reliability.jsonl`` (the
    test's tmp dir when the variable is unset), so a later run can refresh the table
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
        directory = Path(os.environ.get("LLMGW_STATE_DIR") or tmp_path)
        directory.mkdir(parents=True, exist_ok=True)
        with open(reliability.path(directory), "a") as fh:
            fh.write(text + "\n")
        return line

    return write
