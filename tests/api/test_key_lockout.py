"""Unknown bearer keys on /api/v1/ count as failed logins: their source is locked out."""

import pytest
from axes.models import AccessAttempt

from tests.factories import bearer, manage_key

pytestmark = pytest.mark.django_db

LIMIT = 3


@pytest.fixture(autouse=True)
def _settings(settings):
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    settings.AXES_FAILURE_LIMIT = LIMIT


def get(client, secret, ip="192.0.2.10"):
    return client.get("/api/v1/nodes/", REMOTE_ADDR=ip, **bearer(secret))


def test_repeated_unknown_keys_lock_out_their_source(client):
    _, good = manage_key()
    codes = [get(client, f"lgk_{i:08x}_guess").status_code for i in range(LIMIT + 1)]

    locked = get(client, good)

    # the attempt that reaches the limit is answered 429 already, as a login form's is
    assert codes == [401] * (LIMIT - 1) + [429, 429]
    assert locked.status_code == 429
    assert "locked out" in locked.json()["detail"]
    # the lockout is by address, and shows in the admin's access attempts
    assert get(client, good, ip="198.51.100.1").status_code == 200
    attempts = AccessAttempt.objects.filter(ip_address="192.0.2.10")
    assert sum(a.failures_since_start for a in attempts) >= LIMIT
    assert all(a.username.startswith("api key ") for a in attempts)


def test_a_known_prefix_cannot_lock_its_key_out_elsewhere(client):
    key, good = manage_key()
    for i in range(LIMIT + 1):
        get(client, f"lgk_{key.prefix}_guess{i}", ip=f"192.0.2.{i + 1}")

    assert get(client, good, ip="198.51.100.1").status_code == 200
