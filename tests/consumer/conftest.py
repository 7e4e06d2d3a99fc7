"""Fixtures shared by the agent-socket tests."""

import pytest
from django.conf import settings

from fleet.services.heartbeat import apply as heartbeat_apply
from fleet.services.heartbeat import orm as heartbeat_orm

ON_POSTGRES = settings.DATABASES["default"]["ENGINE"].endswith("postgresql")
# The heartbeat's common columns are written by one statement of PostgreSQL's
# own there, by the ORM elsewhere: on PostgreSQL the tests run through both.
WRITE_PATHS = ["portable", "postgresql"] if ON_POSTGRES else ["portable"]


@pytest.fixture(params=WRITE_PATHS)
def write_path(request, monkeypatch):
    """The heartbeat writer under test: "portable" (the ORM) or "postgresql"."""
    if request.param == "portable":
        monkeypatch.setattr(heartbeat_apply, "_common_writer", lambda: heartbeat_orm.apply_common)
    return request.param
