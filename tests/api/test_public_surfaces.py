"""/metrics, /api/schema/ and /api/docs/ can be closed to strangers by a setting."""

import pytest
from asgiref.testing import ApplicationCommunicator

from fleet.metrics import metrics_app
from tests.factories import bearer, manage_key

pytestmark = pytest.mark.django_db


async def scrape(headers=()) -> int:
    scope = {"type": "http", "method": "GET", "path": "/metrics", "headers": list(headers)}
    app = ApplicationCommunicator(metrics_app, scope)
    await app.send_input({"type": "http.request", "body": b""})
    start = await app.receive_output(5)
    await app.receive_output(5)
    return start["status"]


async def test_metrics_are_open_without_a_token(settings):
    settings.METRICS_TOKEN = ""
    assert await scrape() == 200


@pytest.mark.parametrize(
    "headers, status",
    [
        ((), 401),
        (((b"authorization", b"Bearer wrong"),), 401),
        (((b"authorization", b"Basic c2VjcmV0"),), 401),
        (((b"authorization", b"Bearer s3cret-token"),), 200),
    ],
    ids=["none", "wrong", "not bearer", "right"],
)
async def test_metrics_need_the_token_when_one_is_set(settings, headers, status):
    settings.METRICS_TOKEN = "s3cret-token"
    assert await scrape(headers) == status


@pytest.mark.parametrize("path", ["/api/schema/", "/api/docs/"])
def test_schema_and_docs_are_for_staff_by_default(client, path):
    _, secret = manage_key()

    assert client.get(path).status_code in (401, 403)
    assert client.get(path, **bearer(secret)).status_code == 200
