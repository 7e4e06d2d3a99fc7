import pytest

from fleet.services import history


@pytest.fixture(autouse=True)
def _fresh_history():
    """Each test starts with no points in Redis and no memo of the last one."""
    history.forget()
    yield
    history.forget()


@pytest.fixture(autouse=True)
def _fast_passwords(settings):
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
