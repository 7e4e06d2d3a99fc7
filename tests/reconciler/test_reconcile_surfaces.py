"""Where operators meet the reconciler: the API, the admin, /metrics."""

import re
from datetime import timedelta

import pytest
from django.utils import timezone

from fleet import metrics
from fleet.models import FleetStatus, Node
from tests.factories import add_model, add_node, bearer, manage_key
from tests.reconciler.helpers import Clock, make_ready, running

pytestmark = pytest.mark.django_db


@pytest.fixture
def api(client):
    _, secret = manage_key()
    client.defaults.update(bearer(secret))
    return client


def test_api_drain_cordons_and_the_reconciler_moves_the_replica(api):
    add_node("gpu-01")
    model = add_model()
    clock = Clock()
    clock.pass_()
    make_ready(model)
    clock.pass_()
    add_node("gpu-02")

    resp = api.post("/api/v1/nodes/gpu-01/drain/")

    assert resp.status_code == 200, resp.content
    assert resp.json()["cordoned"] is True and resp.json()["draining"] is True
    clock.pass_()
    assert sorted(s.node_id for s in running(model)) == ["gpu-01", "gpu-02"]


def test_api_drain_of_an_unknown_node_is_404(api):
    assert api.post("/api/v1/nodes/nope/drain/").status_code == 404


def test_api_explain_lists_nodes_and_the_choice(api):
    add_node("gpu-07", memory_gb=8, gpus=[])
    add_node("gpu-08", memory_gb=64, gpus=[])
    model = add_model("qwen", gpus_per_node=0, engine="llamacpp", min_memory_gb=24)

    resp = api.get(f"/api/v1/models/{model.pk}/explain/")

    assert resp.status_code == 200, resp.content
    body = resp.json()
    assert body["nodes"] == [
        {"node": "gpu-07", "fits": False, "reason": "gpu-07: has 8 GB of memory, needs 24"},
        {"node": "gpu-08", "fits": True, "reason": "gpu-08: fits (CPU)"},
    ]
    assert body["placement"] == [{"node": "gpu-08", "rank": 0, "gpus": [], "port": 30000}]


def test_api_explain_with_an_unknown_profile_is_not_found(api):
    model = add_model("qwen")

    resp = api.get(f"/api/v1/models/{model.pk}/explain/?profile=nope")

    assert resp.status_code == 404
    assert resp.json() == {"detail": "model 'qwen' has no profile 'nope' (it has: default)"}


def test_api_explain_of_a_model_without_an_active_profile_is_a_conflict(api):
    model = add_model("qwen")
    model.active_profile = None
    model.save()

    resp = api.get(f"/api/v1/models/{model.pk}/explain/")

    assert resp.status_code == 409
    assert resp.json() == {"detail": "model 'qwen' has no active profile; name one with ?profile="}


def test_admin_drain_action(admin_client):
    add_node("gpu-01")
    add_node("gpu-02")
    Node.objects.filter(pk="gpu-02").update(cordoned=True, draining=True)

    resp = admin_client.post(
        "/admin/fleet/node/",
        {"action": "drain_nodes", "_selected_action": ["gpu-01", "gpu-02"]},
        follow=True,
    )

    assert "Draining 1 node (1 already draining)" in resp.content.decode()
    node = Node.objects.get(pk="gpu-01")
    assert node.cordoned and node.draining


def test_admin_banner_when_half_the_fleet_is_silent(admin_client):
    for n in ("gpu-01", "gpu-02", "gpu-03"):
        add_node(n)
    clock = Clock(timezone.now())
    clock.pass_()
    page = admin_client.get("/admin/").content.decode()
    assert "data-fleet-warning" not in page

    clock.advance(60, alive=["gpu-03"], step=10)
    FleetStatus.objects.update(last_pass_at=timezone.now())  # the worker is alive

    page = admin_client.get("/admin/").content.decode()
    assert "replacement paused: 2 of 3 nodes are silent" in page


def test_admin_banner_when_no_pass_runs(admin_client):
    add_node("gpu-01")
    Clock(timezone.now() - timedelta(minutes=5)).pass_()

    page = admin_client.get("/admin/fleet/node/").content.decode()

    assert re.search(r"no reconciler pass for 30\d s", page)
    assert "is the Celery worker and beat running?" in page


def test_metrics_export_the_fleet_status():
    for n in ("gpu-01", "gpu-02", "gpu-03"):
        add_node(n)
    clock = Clock(timezone.now())
    clock.pass_()
    clock.advance(60, alive=["gpu-03"], step=10)

    text = metrics.render().decode()

    assert "llmgw_reconciler_replacement_paused 1.0" in text
    assert "llmgw_reconciler_silent_nodes 2.0" in text
    assert "llmgw_reconciler_fleet_nodes 3.0" in text
    assert "llmgw_reconciler_passes_total 7.0" in text
