"""Weights for operators: the API, the admin and the management commands, over one service."""

import io
from datetime import timedelta

import pytest
from django.core.management import CommandError, call_command
from django.urls import reverse
from django.utils import timezone

from fleet.models import LocalWeights, WeightsEvent
from tests.factories import WEIGHTS_DIR, bearer, grant, manage_key, node_with_weights, staff_user

pytestmark = pytest.mark.django_db

W = WEIGHTS_DIR


@pytest.fixture
def fleet():
    """n1 serves tiny from tiny.gguf and holds an old model nothing needs any more."""
    node_with_weights("n1")
    LocalWeights.objects.filter(path=f"{W}/old").update(
        unused_since=timezone.now() - timedelta(days=2)
    )


def ids():
    return {r.path.rsplit("/", 1)[-1]: r.pk for r in LocalWeights.objects.all()}


def run(*args) -> str:
    out = io.StringIO()
    call_command(*args, stdout=out)
    return out.getvalue()


# ---- manage.py -------------------------------------------------------------------------


def test_weights_command_lists_and_filters(fleet):
    out = run("weights", "--node", "n1")
    lines = out.splitlines()
    assert lines[0].split()[:4] == ["NODE", "PATH", "SIZE", "LAST"]
    tiny = next(line for line in lines if "tiny.gguf" in line)
    assert "in use now" in tiny and "tiny (" in tiny and "1.9 GiB" in tiny
    unused = run("weights", "--unused").splitlines()
    assert len(unused) == 2 and f"{W}/old" in unused[1]
    with pytest.raises(CommandError, match="no node 'nope'"):
        run("weights", "--node", "nope")


def test_gc_weights_dry_run_says_what_would_go_and_why_and_changes_nothing(fleet):
    out = run("gc_weights", "--dry-run")
    assert f"n1 {W}/old (6.5 GiB): unused for 48 h (retention 24 h)" in out
    assert "would propose 1 entry for removal on 1 node" in out
    assert LocalWeights.objects.get(path=f"{W}/old").removal == ""
    assert not WeightsEvent.objects.exists()

    out = run("gc_weights")

    assert "proposed 1 entry for removal on 1 node; each node checks every path" in out
    assert LocalWeights.objects.get(path=f"{W}/old").removal == "proposed"


# ---- the API ---------------------------------------------------------------------------


@pytest.fixture
def api(client):
    _, secret = manage_key()
    client.defaults.update(bearer(secret))
    return client


def test_api_lists_weights_with_what_uses_them(api, fleet):
    body = api.get("/api/v1/weights/", {"node": "n1"}).json()
    by_path = {e["path"]: e for e in body["results"]}
    assert by_path[f"{W}/tiny.gguf"]["in_use_by"][0].startswith("tiny (")
    assert by_path[f"{W}/old"]["in_use_by"] == []
    unused = api.get("/api/v1/weights/", {"unused": "true"}).json()["results"]
    assert [e["path"] for e in unused] == [f"{W}/old"]
    assert api.get("/api/v1/weights/", {"unused": "maybe"}).status_code == 400


def test_api_pin_unpin_remove_and_cleanup(api, fleet):
    old, tiny = ids()["old"], ids()["tiny.gguf"]
    assert api.post(f"/api/v1/weights/{old}/pin/").json()["pinned"] is True
    dry = api.get("/api/v1/weights/cleanup/").json()
    assert dry == {"proposals": [], "refused": [], "waiting": [], "skipped": False}

    refused = api.post(f"/api/v1/weights/{old}/remove/").json()
    assert refused["proposals"] == [] and refused["refused"][0]["reason"] == "pinned"
    assert api.post(f"/api/v1/weights/{old}/unpin/").json()["pinned"] is False
    # Asking runs a pass: the answer is that pass's, what it proposed and what it refused.
    in_use = api.post(f"/api/v1/weights/{tiny}/remove/").json()

    assert in_use["refused"][0]["path"] == f"{W}/tiny.gguf"
    assert in_use["refused"][0]["reason"].startswith("in use")
    assert [(p["path"], p["size_bytes"]) for p in in_use["proposals"]] == [(f"{W}/old", 7 * 10**9)]
    assert in_use["proposals"][0]["reason"] == "unused for 48 h (retention 24 h)"
    assert api.get(f"/api/v1/weights/{old}/").json()["removal"] == "proposed"
    assert api.post("/api/v1/weights/cleanup/").json()["proposals"] == []  # under way
    # Asked for again while its removal is under way: the answer says so, not nothing.
    again = api.post(f"/api/v1/weights/{old}/remove/").json()
    assert again["proposals"] == [] and again["refused"] == []
    assert [(w["path"], w["reason"]) for w in again["waiting"]] == [
        (f"{W}/old", "a removal of it is already under way")
    ]
    assert api.post("/api/v1/weights/999999/pin/").status_code == 404


def test_api_changing_weights_needs_the_change_permission(client, fleet):
    user = grant(staff_user("viewer"), "fleet.view_localweights")
    _, secret = manage_key(user=user)
    client.defaults.update(bearer(secret))
    assert client.get("/api/v1/weights/").status_code == 200
    assert client.get("/api/v1/weights/cleanup/").status_code == 200
    assert client.post(f"/api/v1/weights/{ids()['old']}/pin/").status_code == 403
    assert client.post("/api/v1/weights/cleanup/").status_code == 403
    assert not LocalWeights.objects.filter(pinned=True).exists()


# ---- the admin -------------------------------------------------------------------------


def test_admin_shows_weights_and_its_actions_go_through_the_service(admin_client, fleet):
    url = reverse("admin:fleet_localweights_changelist")
    page = admin_client.get(url).content.decode()
    assert "in use now" in page and "tiny (" in page

    admin_client.post(url, {"action": "pin", "_selected_action": [ids()["tiny.gguf"]]})
    assert LocalWeights.objects.get(path=f"{W}/tiny.gguf").pinned
    resp = admin_client.post(
        url,
        {"action": "remove_now", "_selected_action": list(ids().values())},
        follow=True,
    )

    text = resp.content.decode().lower()
    assert "proposed 1 for removal; each node checks again" in text
    assert f"kept {W}/tiny.gguf: pinned" in text
    assert LocalWeights.objects.get(path=f"{W}/old").removal == "proposed"
    events = admin_client.get(reverse("admin:fleet_weightsevent_changelist")).content.decode()
    assert f"{W}/old" in events and "an operator asked to remove it" in events
