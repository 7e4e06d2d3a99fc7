"""Fixtures for the end-to-end suite: the whole stack as real processes on the test database."""

from pathlib import Path

import pytest

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
