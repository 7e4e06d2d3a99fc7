"""GPU faults and notices through the API (docs/operations.md, "GPU faults and notices"):
a GPU's health fields and the filter by it, clearing a fault
with a reason, a node's notice by hand. Each goes through fleet.services.gpu_health:
refused without its permission, bad input changes nothing, the audit trail keeps it."""

import pytest
from auditlog.models import LogEntry

from fleet.models import GPU, Event, EventKind, Node
from tests.factories import add_node, bearer, grant, manage_key, report_gpu_events, staff_user

pytestmark = pytest.mark.django_db

XID_79 = "XID 79: GPU has fallen off the bus"


@pytest.fixture
def failed():
    """gpu-01's GPU 3 fell off the bus (XID 79), and its GPU 5 reported a watched XID 13."""
    add_node("gpu-01")
    report_gpu_events("gpu-01", (3, "xid", 79), (5, "xid", 13), (5, "xid", 13))
    return GPU.objects.get(node_id="gpu-01", index=3)


def row(node_id="gpu-01", index=3) -> GPU:
    return GPU.objects.get(node_id=node_id, index=index)


def changes_of(obj) -> list[dict]:
    return [e.changes_dict for e in LogEntry.objects.get_for_object(obj).order_by("id")]


# ---- what the API shows -------------------------------------------------------------------


def test_a_gpus_health_and_xids_are_in_the_api_and_it_filters_by_health(api, failed):
    gpu = api.get(f"/api/v1/gpus/{failed.pk}/").json()

    assert gpu["health"] == "failed" and gpu["health_reason"] == XID_79
    assert gpu["fault"] == "failed" and gpu["fault_reason"] == XID_79 and gpu["fault_at"]
    assert gpu["xids"] == {"79": 1}
    assert gpu["healthy"] is False, "a failed GPU is not healthy: it has no problems, a fault"
    watched = api.get("/api/v1/gpus/?node=gpu-01&index=5").json()["results"]
    assert [(g["health"], g["xids"]) for g in watched] == [("healthy", {"13": 2})]

    by_health = {
        h: [g["index"] for g in api.get(f"/api/v1/gpus/?health={h}").json()["results"]]
        for h in ("failed", "degraded", "healthy")
    }
    assert by_health == {"failed": [3], "degraded": [], "healthy": [0, 1, 2, 4, 5, 6, 7]}
    assert api.get("/api/v1/gpus/?healthy=false").json()["count"] == 1
    assert api.get("/api/v1/gpus/?health__in=failed,degraded").json()["count"] == 1
    assert api.get("/api/v1/gpus/?health=broken").status_code == 400
    assert api.get("/api/v1/gpus/?index=0.5").status_code == 400, "not read as 0"
    # the node carries its GPUs' health too
    node = api.get("/api/v1/nodes/gpu-01/").json()
    assert {g["index"]: g["health"] for g in node["gpus"]}[3] == "failed"


def test_a_nodes_gpu_events_are_listed_by_node(api, failed):
    add_node("gpu-02")
    report_gpu_events("gpu-02", (0, "xid", 48))

    mine = api.get("/api/v1/events/?node=gpu-01&kind=gpu").json()["results"]

    assert [e["node"] for e in mine] == ["gpu-01"]
    assert "GPU gpu-01/gpu3: healthy → failed (XID 79" in mine[0]["reason"]


# ---- clearing a fault ---------------------------------------------------------------------


def clear(client, gpu, body, secret=None):
    headers = bearer(secret) if secret else {}
    return client.post(
        f"/api/v1/gpus/{gpu.pk}/clear/", body, content_type="application/json", **headers
    )


def test_clearing_a_fault_with_a_reason_puts_the_gpu_back_and_is_audited(api, failed):
    resp = clear(api, failed, {"reason": "reseated; dcgmi diag -r 3 passed"})

    assert resp.status_code == 200, resp.content
    body = resp.json()
    assert body["changed"] is True
    assert body["detail"] == (
        "GPU gpu-01/gpu3 cleared by user 'ops': reseated; dcgmi diag -r 3 passed; it is healthy now"
    )
    assert (body["gpu"]["health"], body["gpu"]["fault"]) == ("healthy", "healthy")
    g = row()
    assert (g.health, g.fault, g.fault_reason, g.drained_at) == ("healthy", "healthy", "", None)
    assert g.xids == {"79": 1}, "the count stays: it happened"
    [entry] = changes_of(g)
    assert entry["fault"] == ["failed", "healthy"]
    assert entry["reason"] == ["", "reseated; dcgmi diag -r 3 passed"]
    assert LogEntry.objects.get_for_object(g).get().additional_data["door"] == "api"
    event = Event.objects.filter(kind=EventKind.GPU, node_id="gpu-01").first()
    assert event.reason == body["detail"]

    # again: nothing to clear, said so, nothing written
    again = clear(api, failed, {"reason": "once more"}).json()
    assert again["changed"] is False
    assert again["detail"] == "GPU gpu-01/gpu3 has no fault to clear (healthy)"
    assert len(changes_of(g)) == 1


@pytest.mark.parametrize(
    ("body", "says"),
    [
        ({}, "This field is required."),
        ({"reason": ""}, "This field may not be blank."),
        ({"reason": "   "}, "say why the GPU is fine again: the audit trail keeps it"),
        ({"reason": 7}, "Not a valid string."),
        ({"reason": "x" * 256}, "Ensure this field has no more than 255 characters."),
    ],
)
def test_a_clear_without_a_reason_is_refused_naming_it_and_changes_nothing(api, failed, body, says):
    resp = clear(api, failed, body)

    assert resp.status_code == 400
    assert resp.json() == {"reason": [says]}
    g = row()
    assert (g.health, g.fault) == ("failed", "failed")
    assert changes_of(g) == []


def test_a_clear_needs_the_drain_permission(client, failed):
    viewer = grant(staff_user("viewer"), "fleet.view_gpu", "fleet.view_node")
    _, secret = manage_key(user=viewer)

    refused = clear(client, failed, {"reason": "reset"}, secret)

    assert refused.status_code == 403
    assert row().fault == "failed" and changes_of(row()) == []
    grant(viewer, "fleet.drain_node")
    assert clear(client, failed, {"reason": "reset"}, secret).status_code == 200
    assert row().fault == "healthy"


def test_an_unknown_gpu_is_404(api):
    assert clear(api, GPU(pk=999_999), {"reason": "x"}).status_code == 404


# ---- a node's notice ----------------------------------------------------------------------


def notice(client, node_id, body, secret=None):
    headers = bearer(secret) if secret else {}
    return client.post(
        f"/api/v1/nodes/{node_id}/notice/", body, content_type="application/json", **headers
    )


def test_a_notice_drains_the_node_and_says_so_on_it_and_in_an_event(api):
    add_node("gpu-01")

    resp = notice(api, "gpu-01", {"in_s": 120, "reason": "spot reclaim"})

    assert resp.status_code == 200, resp.content
    body = resp.json()
    assert body["detail"] == (
        "node gpu-01 goes away in 120 s (operator: spot reclaim, said by user 'ops'): "
        "draining it now, replacements first"
    )
    node = body["node"]
    assert (node["cordoned"], node["draining"]) == (True, True)
    assert node["notice_deadline"] and node["notice_source"] == "operator"
    assert node["notice_reason"] == "spot reclaim"
    [event] = api.get("/api/v1/events/?kind=notice&node=gpu-01").json()["results"]
    assert event["reason"] == body["detail"]
    changed = [
        e.changes_dict for e in LogEntry.objects.get_for_object(Node.objects.get(pk="gpu-01"))
    ]
    assert any("notice_deadline" in c for c in changed) and any("draining" in c for c in changed)

    # a later notice does not push the deadline back
    later = notice(api, "gpu-01", {"in_s": 600}).json()
    assert later["detail"].startswith("node gpu-01 has notice already: it goes at ")
    assert later["node"]["notice_deadline"] == node["notice_deadline"]


@pytest.mark.parametrize(
    ("body", "says"),
    [
        ({}, "This field is required."),
        ({"in_s": -1}, "a notice is 0 to 604800 s ahead, not in the past"),
        ({"in_s": 10**7}, "a notice is 0 to 604800 s (a week) ahead, not more"),
        ({"in_s": "120s"}, "A valid number is required."),
        ({"in_s": True}, "A valid number is required."),
    ],
)
def test_a_bad_notice_is_refused_naming_it_and_changes_nothing(api, body, says):
    add_node("gpu-01")

    resp = notice(api, "gpu-01", body)

    assert resp.status_code == 400
    assert resp.json() == {"in_s": [says]}
    node = Node.objects.get(pk="gpu-01")
    assert (node.notice_deadline, node.cordoned, node.draining) == (None, False, False)
    assert not Event.objects.filter(kind=EventKind.NOTICE).exists()


def test_a_notice_needs_the_drain_permission(client):
    add_node("gpu-01")
    viewer = grant(staff_user("viewer"), "fleet.view_node")
    _, secret = manage_key(user=viewer)

    assert notice(client, "gpu-01", {"in_s": 60}, secret).status_code == 403
    assert Node.objects.get(pk="gpu-01").notice_deadline is None
