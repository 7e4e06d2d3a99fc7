import pytest

from fleet.services import canary_figures, history


@pytest.fixture(autouse=True)
def _fresh_history():
    """Each test starts with no points in Redis and no memo of the last one."""
    history.forget()
    canary_figures.forget()
    yield
    history.forget()
    canary_figures.forget()


@pytest.fixture(autouse=True)
def _fast_passwords(settings):
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
