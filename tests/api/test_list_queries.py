"""List pages and API lists cost the same number of queries for 1 node as for 3 (no N+1)."""

from datetime import timedelta

import pytest
from django.apps import apps
from django.contrib import admin
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from fleet.models import ApiKey, ApiKeyScope
from fleet.services import access
from tests.factories import LLAMACPP_CPU, add_model, add_node, add_replica, enrol_node, report_load

pytestmark = pytest.mark.django_db

FLEET_MODELS = [m for m in apps.get_app_config("fleet").get_models() if m in admin.site._registry]
API_LISTS = ["nodes", "gpus", "models", "engine-profiles", "replicas", "shards"]


def grow(start, count):
    """``count`` more nodes, each with GPUs, load, a model, a replica and secrets."""
    for i in range(start, start + count):
        node_id = f"gpu-{i:02d}"
        enrol_node(node_id)
        add_node(node_id, as_reported=True)
        report_load(node_id, shards=[{"shard_id": f"s-{i}", "cpu_cores": 1.5, "rss_bytes": 2**33}])
        model = add_model(f"model-{i}", **LLAMACPP_CPU)
        profile = model.active_profile
        add_replica(model, profile, [node_id])
        access.create_join_token(f"rack-{i}", ttl=timedelta(hours=1))
        ApiKey.issue(name=f"client-{i}", scope=ApiKeyScope.INFERENCE)


def queries(client, url):
    with CaptureQueriesContext(connection) as ctx:
        response = client.get(url)
    assert response.status_code == 200, url
    return len(ctx.captured_queries)


def counts(client):
    out = {}
    for model in FLEET_MODELS:
        out[model.__name__] = queries(
            client, reverse(f"admin:fleet_{model._meta.model_name}_changelist")
        )
    for name in API_LISTS:
        out[f"api {name}"] = queries(client, f"/api/v1/{name}/")
    return out


def test_list_views_do_not_query_per_row(admin_client):
    grow(1, 1)
    small = counts(admin_client)
    grow(2, 2)
    large = counts(admin_client)
    grew = {k: (small[k], large[k]) for k in small if large[k] != small[k]}
    assert grew == {}
