"""The management API fuzzed from its own OpenAPI schema: no request makes it answer 500.

schemathesis generates requests for every operation from the schema
drf-spectacular serves at /api/schema/, valid and invalid, and sends them
through Django's WSGI handler with a superuser's manage key, against a small
fleet. The only check here is the one every API owes its callers: a bad
request is the caller's error (4xx), never the server's (5xx). Whether the
schema tells the whole truth is a stricter matter (conformance checks).
"""

import pytest
import schemathesis
from django.contrib.auth import get_user_model
from django.core.signals import request_finished, request_started
from django.core.wsgi import get_wsgi_application
from django.db import close_old_connections
from drf_spectacular.generators import SchemaGenerator
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error

from fleet.models import ApiKeyScope
from fleet.services import api_keys
from tests.factories import LLAMACPP_CPU, add_model, add_node, add_replica

schema = schemathesis.openapi.from_dict(SchemaGenerator().get_schema(request=None, public=True))
APP = get_wsgi_application()


@pytest.fixture
def manage_headers(db):
    # Django's test client keeps the test's connection open across requests;
    # a bare WSGI call would close it at the end of each request.
    request_started.disconnect(close_old_connections)
    request_finished.disconnect(close_old_connections)
    # given a small fleet: a node, a model with a replica on it, and a key
    add_node("gpu-01", as_reported=True)
    model = add_model("qwen-7b", **LLAMACPP_CPU)
    profile = model.active_profile
    add_replica(model, profile, ["gpu-01"])
    user = get_user_model().objects.create_superuser("fuzz", "fuzz@example.com", "x")
    _, secret = api_keys.create_api_key("fuzz", scope=ApiKeyScope.MANAGE, user=user)
    yield {"Authorization": f"Bearer {secret}"}
    request_started.connect(close_old_connections)
    request_finished.connect(close_old_connections)


@schema.parametrize()
@settings(
    max_examples=10,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    database=None,
)
def test_no_request_is_a_server_error(case, manage_headers):
    response = case.call(app=APP, headers=manage_headers)
    case.validate_response(response, checks=[not_a_server_error])
