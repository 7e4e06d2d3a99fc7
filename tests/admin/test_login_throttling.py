"""Admin logins are throttled by django-axes: by user and by source address alike."""

import pytest
from axes.models import AccessAttempt
from django.urls import reverse

from tests.factories import staff_user

pytestmark = pytest.mark.django_db

LOGIN = reverse("admin:login")
LIMIT = 3


@pytest.fixture(autouse=True)
def _settings(settings):
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    settings.AXES_FAILURE_LIMIT = LIMIT


def login(client, username, password, ip="192.0.2.10"):
    return client.post(
        LOGIN,
        {"username": username, "password": password, "next": "/admin/"},
        REMOTE_ADDR=ip,
    )


def test_the_right_password_logs_in(client):
    staff_user("ops")
    assert login(client, "ops", "pw-for-tests").status_code == 302


def test_a_user_is_locked_out_after_the_limit_from_any_address(client):
    staff_user("ops")
    codes = [login(client, "ops", f"guess-{i}", ip=f"192.0.2.{i}").status_code for i in range(5)]

    right = login(client, "ops", "pw-for-tests", ip="198.51.100.1")

    # the form answers 200 ("wrong password") until the limit, then 429
    assert codes[: LIMIT - 1] == [200] * (LIMIT - 1) and codes[LIMIT:] == [429, 429]
    assert right.status_code == 429
    assert "_auth_user_id" not in client.session


def test_an_address_is_locked_out_whatever_user_it_tries(client):
    staff_user("ops")
    for i in range(LIMIT):
        login(client, f"user-{i}", "guess")

    assert login(client, "ops", "pw-for-tests").status_code == 429
    assert login(client, "ops", "pw-for-tests", ip="198.51.100.1").status_code == 302


def test_the_lockout_shows_in_the_admin(client, admin_client):
    for i in range(LIMIT):
        login(client, "ops", f"guess-{i}")

    page = admin_client.get(reverse("admin:axes_accessattempt_changelist")).content.decode()

    assert AccessAttempt.objects.get(username="ops").failures_since_start == LIMIT
    assert "ops" in page and "192.0.2.10" in page
