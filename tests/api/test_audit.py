"""The audit trail (fleet/audit.py): a change made through each door appears once, with
its author, the door, the address and each field before and after; secrets never."""

import sys
from datetime import timedelta

import pytest
from auditlog.models import LogEntry
from django.urls import reverse
from django.utils import timezone

import manage
from fleet import audit
from fleet.models import Model, Node
from fleet.services import api_keys, canary
from fleet.services import nodes as node_service
from fleet.services.permissions import SYSTEM
from tests.admin.helpers import form_data
from tests.factories import add_model, add_node, bearer, grant, manage_key, staff_user

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _fast_passwords(settings):
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


def mark() -> int:
    """The newest entry's id: what a test did comes after it (its set-up is recorded too)."""
    return LogEntry.objects.order_by("-id").values_list("id", flat=True).first() or 0


def of(obj, after: int) -> list[LogEntry]:
    return list(LogEntry.objects.get_for_object(obj).filter(id__gt=after).order_by("id"))


def test_an_api_change_is_its_keys_user_s_once_with_the_fields_before_and_after(client):
    model = add_model("qwen", replicas=1)
    key, secret = manage_key()
    start = mark()

    resp = client.patch(
        f"/api/v1/models/{model.pk}/",
        {"desired_replicas": 3},
        content_type="application/json",
        REMOTE_ADDR="10.1.2.3",
        **bearer(secret),
    )

    assert resp.status_code == 200, resp.content
    (entry,) = of(model, start)
    assert entry.actor == key.user
    assert entry.additional_data["door"] == "api"
    assert entry.additional_data["request"] == f"PATCH /api/v1/models/{model.pk}/"
    assert entry.remote_addr == "10.1.2.3"
    assert entry.changes_dict == {"desired_replicas": ["1", "3"]}


def test_a_teams_quota_and_a_model_given_to_it_are_recorded_with_their_author(client):
    from django.contrib.auth.models import Group

    from fleet.models import Team

    research = Team.objects.create(name="research", group=Group.objects.create(name="research"))
    model = add_model("qwen", replicas=1)
    key, secret = manage_key()
    start = mark()

    quota = client.patch(
        f"/api/v1/teams/{research.pk}/", {"max_gpus": 8}, content_type="application/json",
        **bearer(secret),
    )  # fmt: skip
    given = client.patch(
        f"/api/v1/models/{model.pk}/", {"team": "research"}, content_type="application/json",
        **bearer(secret),
    )  # fmt: skip

    assert quota.status_code == given.status_code == 200
    (entry,) = of(research, start)
    assert (entry.actor, entry.additional_data["door"]) == (key.user, "api")
    assert entry.changes_dict == {"max_gpus": ["None", "8"]}
    (entry,) = of(model, start)
    assert entry.actor == key.user
    assert entry.changes_dict == {"team": ["None", str(research.pk)]}


def test_an_adapters_new_source_is_recorded_with_its_author_and_its_gateway_times_are_not(
    client,
):
    from fleet.models import Adapter

    model = add_model("qwen")
    adapter = Adapter.objects.create(name="qwen-sql", model=model, source="/l/v1.gguf")
    key, secret = manage_key()
    start = mark()

    changed = client.patch(
        f"/api/v1/adapters/{adapter.pk}/", {"source": "/l/v2.gguf"},
        content_type="application/json", **bearer(secret),
    )  # fmt: skip
    Adapter.objects.filter(pk=adapter.pk).update(last_request_at=timezone.now())
    adapter.refresh_from_db()
    adapter.save()  # the system's own times: no change of anyone's

    assert changed.status_code == 200
    (entry,) = of(adapter, start)
    assert entry.actor == key.user
    assert entry.changes_dict == {"source": ["/l/v1.gguf", "/l/v2.gguf"]}


def test_llmgw_and_apply_are_their_own_doors(client):
    key, secret = manage_key()
    node = add_node("gpu-01")
    llmgw = {"HTTP_USER_AGENT": "llmgw/0.1.0", **bearer(secret)}
    start = mark()

    client.post("/api/v1/nodes/gpu-01/cordon/", **llmgw)
    applied = client.post(
        "/api/v1/catalog/apply/",
        {"catalog": "models:\n- name: small\n  replicas: 0\n"},
        content_type="application/json",
        **llmgw,
    )

    (cordoned,) = of(node, start)
    assert cordoned.actor == key.user and cordoned.additional_data["door"] == "llmgw"
    assert cordoned.changes_dict == {"cordoned": ["False", "True"]}
    assert applied.status_code == 200, applied.content
    (made,) = LogEntry.objects.get_for_object(Model.objects.get(name="small"))
    assert made.action == LogEntry.Action.CREATE and made.actor == key.user
    assert made.additional_data["request"] == "POST /api/v1/catalog/apply/"


def test_an_admin_change_is_recorded_with_its_user(client):
    model = add_model("qwen", replicas=1)
    user = grant(staff_user("ops"), "fleet.view_model", "fleet.change_model")
    client.force_login(user)
    page = reverse("admin:fleet_model_change", args=[model.pk])
    data = form_data(client.get(page).content.decode())
    data["desired_replicas"] = "2"
    start = mark()

    assert client.post(page, data).status_code == 302

    (entry,) = of(model, start)
    assert entry.actor == user and entry.additional_data["door"] == "admin"
    assert entry.changes_dict["desired_replicas"] == ["1", "2"]


@pytest.mark.django_db(transaction=True)  # a command closes its connection when done
def test_a_management_command_is_its_door_and_as_names_the_user(monkeypatch, capsys):
    node = add_node("gpu-01")
    ops = staff_user("ops", is_superuser=True)
    monkeypatch.setattr(sys, "argv", ["manage.py", "cordon", "gpu-01", "--as", "ops"])
    start = mark()

    manage.main()

    (entry,) = of(node, start)
    assert entry.actor == ops
    assert entry.additional_data["door"] == "manage.py cordon"
    assert entry.additional_data["os_user"]
    # and without --as: the shell's user only, no Django user
    monkeypatch.setattr(sys, "argv", ["manage.py", "uncordon", "gpu-01"])
    manage.main()
    entry = of(node, start)[-1]
    assert entry.actor is None and entry.additional_data["door"] == "manage.py uncordon"


def test_the_systems_own_decisions_are_kept_apart_from_peoples():
    model = add_model("qwen")
    other = model.profiles.create(name="fp8", engine="fake", model_path="/m/q")
    Model.objects.filter(pk=model.pk).update(canary_profile=other, canary_percent=25)
    model.refresh_from_db()
    start = mark()

    canary.abort(model, SYSTEM, "error rate 33.3% over 30 answers, past its bound of 5.0%")

    (entry,) = of(model, start)
    assert entry.actor is None and entry.additional_data["door"] == "system"
    assert entry.changes_dict["canary_profile"] == [str(other.pk), None]
    people = LogEntry.objects.filter(actor__isnull=False)
    assert entry not in people


def test_a_keys_secret_never_reaches_the_trail():
    owner = staff_user("ops")
    with audit.acting("api", owner):
        key, secret = api_keys.create_api_key("team", user=owner)
        api_keys.rotate_api_key(key, timedelta(hours=1))
        api_keys.revoke_api_key(key)

    said = [e.changes_dict for e in LogEntry.objects.get_for_object(key).order_by("id")]
    text = repr(said)
    assert len(said) == 3, said  # made, rotated, revoked
    assert secret not in text and key.secret_hash not in text and "secret_hash" not in text
    assert "previous_secret_expires_at" in said[1] and "revoked_at" in said[2]


def test_entries_are_never_changed_and_expire_after_the_retention(settings):
    node = add_node("gpu-01")
    start = mark()
    node_service.cordon(node)
    (entry,) = of(node, start)

    entry.changes_text = "nothing happened"
    with pytest.raises(PermissionError, match="append-only"):
        entry.save()

    settings.LLMGW = {**settings.LLMGW, "AUDIT_RETENTION_DAYS": 30}
    LogEntry.objects.filter(pk=entry.pk).update(timestamp=timezone.now() - timedelta(days=31))
    kept = LogEntry.objects.count() - 1
    assert audit.expire() == 1
    assert LogEntry.objects.count() == kept
    settings.LLMGW = {**settings.LLMGW, "AUDIT_RETENTION_DAYS": 0}
    LogEntry.objects.update(timestamp=timezone.now() - timedelta(days=3650))
    assert audit.expire() == 0 and LogEntry.objects.count() == kept


def test_the_audit_api_filters_and_needs_its_view_permission(client):
    add_node("gpu-01")
    add_node("gpu-02")
    ops = staff_user("ops")
    with audit.acting("api", ops):
        node_service.cordon(Node.objects.get(pk="gpu-01"))
    node_service.cordon(Node.objects.get(pk="gpu-02"))  # the system's

    viewer = staff_user("viewer")
    _, secret = manage_key(user=viewer)
    refused = client.get("/api/v1/audit/", **bearer(secret))
    grant(viewer, "auditlog.view_logentry")
    mine = client.get("/api/v1/audit/?actor=ops&object_type=node", **bearer(secret)).json()
    system = client.get("/api/v1/audit/?door=system&object=gpu-02", **bearer(secret)).json()

    assert refused.status_code == 403
    (row,) = mine["results"]
    assert row["object"] == "gpu-01" and row["actor"] == "ops" and row["door"] == "api"
    assert row["action"] == "update" and row["changes"] == {"cordoned": ["False", "True"]}
    (row,) = system["results"]
    assert row["actor"] is None and row["object"] == "gpu-02"


def test_the_audit_trail_is_read_only_in_the_admin(admin_client):
    node = add_node("gpu-01")
    start = mark()
    node_service.cordon(node)
    (entry,) = of(node, start)

    LogEntry.objects.filter(pk=entry.pk).update(
        remote_addr="10.9.8.7", additional_data={"door": "llmgw"}
    )
    page = admin_client.get(reverse("admin:auditlog_logentry_change", args=[entry.pk]))
    listing = admin_client.get(reverse("admin:auditlog_logentry_changelist"))
    deleted = admin_client.post(
        reverse("admin:auditlog_logentry_delete", args=[entry.pk]), {"post": "yes"}
    )

    assert listing.status_code == 200 and "gpu-01" in listing.content.decode()
    # an entry's page says through which door, and from where
    shown = page.content.decode()
    assert page.status_code == 200 and "llmgw" in shown and "10.9.8.7" in shown
    assert deleted.status_code == 403
    assert LogEntry.objects.filter(pk=entry.pk).exists()
