"""Fixtures of the API tests: an API client with a manage key, and quick password hashing."""

import pytest

from tests.factories import bearer, manage_key


@pytest.fixture(autouse=True)
def _fast_passwords(settings):
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture
def api(client):
    """A client holding a manage key of a staff user."""
    _, secret = manage_key()
    client.defaults.update(bearer(secret))
    return client
