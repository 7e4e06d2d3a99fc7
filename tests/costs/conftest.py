"""The cost tests' fixtures: the e2e suite's own PostgreSQL, for the second database path."""

from tests.e2e.conftest import postgres  # noqa: F401  (a fixture, used by name)
