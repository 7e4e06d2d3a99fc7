"""The audit trail (fleet/audit.py): a change made through each door appears once, with
its author, the door, the address and each field before and after; secrets never.

The last part is generated: every write door of the authorization walk
(tests/security/test_authorization_generated.py) is walked here too, and a door added
later whose change is not in the trail fails."""

import sys
from datetime import timedelta

import pytest
from auditlog.models import LogEntry
from django.db import transaction
from django.urls import reverse
from django.utils import timezone

import manage
from fleet import audit
from fleet.audit import KEPT_UP
from fleet.models import Model, Node
from fleet.services import api_keys, canary
from fleet.services import nodes as node_service
from fleet.services.permissions import SYSTEM
from tests.admin.helpers import form_data
from tests.factories import add_model, add_node, bearer, grant, manage_key, staff_user
from tests.security.test_authorization_generated import (
    EXPECTED,
    NoChange,
    NotADoor,
    Walkers,
    changed_by,
    client_of,
    world,  # noqa: F401 - a fixture
)

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


# ---- every door, generated from the authorization walk's list ------------------------------
#
# The doors are tests.security.test_authorization_generated's: found from the URL conf, the
# admin registry and the commands, each with its walks. Each walk is made here as the user
# who may (the walk's permissions and the views), in a savepoint, and every row it adds,
# removes or changes in a model the trail registers (on a field it records) must have an
# entry naming that user and the door; a door whose change is all outside the trail must be
# listed below, with why. A door added later with no entry fails here as it fails there.

# Doors whose change the trail leaves out, and why; docs/security.md's "Audit trail" says
# what it keeps. Every other door that changes a row is in it.
AXES = "django-axes's own records of logins, which the trail does not keep"
EVENTS = "the control plane's log of its own decisions, which the trail does not keep"
CLEAN_UP = (
    "a pass of the weights clean-up, the same one beat runs: what it proposes are "
    "WeightsEvents (docs/operations.md), the system's decision, not a person's"
)
UNAUDITED: dict[str, str] = {
    **{
        f"admin:axes.{name}:{view}": AXES
        for name in ("accessattempt", "accesslog", "accessfailurelog")
        for view in ("delete", "action:delete_selected")
    },
    "admin:axes.accessattempt:action:cleanup_expired_attempts": AXES,
    "admin:fleet.event:delete": EVENTS,
    "admin:fleet.event:action:delete_selected": EVENTS,
    "api:WeightsViewSet.cleanup_run": CLEAN_UP,
    "command:gc_weights": CLEAN_UP,
    "url:admin:auth_user_password_change": "a user's password is never in the trail",
}


def door_in_trail(door: str) -> str:
    """What the trail calls the door ``door`` (a walk's name) came through."""
    kind, _, rest = door.partition(":")
    if kind == "command":
        return f"manage.py {rest}"
    if kind == "url":
        return "console" if rest.startswith("console:") else "admin"
    return kind  # api, admin


def through(door: str, go):
    """``go`` as the door runs it: a command inside manage.py's scope (audit.command_scope)."""
    if not door.startswith("command:"):
        return go
    name = door.removeprefix("command:")

    def scoped(w, user):
        with audit.command_scope(["manage.py", name]):
            return go(w, user)

    return scoped


def _cascaded(d, model, before: dict, column: str) -> bool:
    """Whether ``column`` of a row changed only because the row it named was removed in
    the same change (``on_delete=SET_NULL``): that removal's entry says it."""
    f = next((f for f in model._meta.concrete_fields if f.attname == column), None)
    if f is None or not f.is_relation:
        return False
    return before[column] in d.removed.get(f.related_model._meta.label_lower, {})


def recorded_rows(d) -> set[tuple[str, str]]:
    """(label, pk) of each row ``d`` changed that the trail records itself: a row made or
    removed of a model it registers, or a change to a field it keeps."""
    from auditlog.registry import auditlog
    from django.apps import apps as registry

    rows = set()
    for kind in (d.added, d.removed, d.changed):
        for label, by_pk in kind.items():
            model = registry.get_model(label)
            if label == "auditlog.logentry" or not auditlog.contains(model):
                continue
            kept = set(auditlog.get_model_fields(model)["include_fields"]) - set(KEPT_UP)
            names = {f.attname: f.name for f in model._meta.concrete_fields}
            for pk, row in by_pk.items():
                if kind is d.changed:
                    before, after = row
                    changed = {
                        names[c]
                        for c in before
                        if before[c] != after[c] and not _cascaded(d, model, before, c)
                    }
                    if not changed & kept:
                        continue
                rows.add((label, str(pk)))
    return rows


def run(w, go, user, prepare=None):
    """As the authorization walk's ``run``, with both users logged in once, outside the
    savepoint (their sessions outlive it): what ``go`` as ``user`` changed."""
    client_of(w.root), client_of(user)
    with transaction.atomic():
        w.prepared = prepare(w, user) if prepare else None
        changed = changed_by(lambda: go(w, user))
        transaction.set_rollback(True)
    return changed


def entries_of(d) -> list[dict]:
    return list(d.added.get("auditlog.logentry", {}).values())


def audit_door(w, door: str) -> tuple[list[str], dict]:
    """Each walk of ``door`` by the user who may; the breaches, and what was walked."""
    from django.contrib.contenttypes.models import ContentType

    expected, said = EXPECTED[door], door_in_trail(door)
    walkers, breaches = Walkers(), []
    counts = {"audited": 0, "unchanged": 0, "unaudited": 0}
    if isinstance(expected, NoChange):
        d = run(w, through(door, expected.go), walkers.everything(), expected.prepare)
        if entries := entries_of(d):
            breaches.append(f"{door} ({expected.why}) recorded {len(entries)} entries")
        counts["unchanged"] = 1
        return breaches, counts
    for walk in expected:
        label = f"{door}{f' ({walk.name})' if walk.name else ''}"
        user = walkers.exactly(walk.needs)
        d = run(w, through(door, walk.go), user, walk.prepare)
        entries = entries_of(d)
        ours = [
            e
            for e in entries
            if e["actor_id"] == user.pk and (e["additional_data"] or {}).get("door") == said
        ]
        who = f"by {user.get_username()} through '{said}'"
        seen = [(e["actor_id"], (e["additional_data"] or {}).get("door")) for e in entries]
        if door in UNAUDITED:
            if entries:
                breaches.append(f"{label} is in UNAUDITED, yet recorded {len(entries)} entries")
            counts["unaudited"] += 1
            continue
        if not ours:
            breaches.append(
                f"{label} changed {d} with no entry {who} (entries by (user id, door): "
                f"{seen or 'none'}): record it, or say why in UNAUDITED"
            )
            continue
        named = set()
        for e in ours:
            model = ContentType.objects.get_for_id(e["content_type_id"]).model_class()
            named.add((model._meta.label_lower, e["object_pk"]))
        if missing := sorted(recorded_rows(d) - named):
            breaches.append(f"{label}: no entry {who} for {missing} (entries: {seen})")
        counts["audited"] += 1
    return breaches, counts


AUDITED_DOORS = sorted(door for door, e in EXPECTED.items() if not isinstance(e, NotADoor))


@pytest.mark.parametrize("door", AUDITED_DOORS)
def test_every_door_s_change_is_in_the_trail_with_its_user_and_door(world, door, record_property):  # noqa: F811
    breaches, counts = audit_door(world, door)
    record_property("audit_walk", counts)
    assert not breaches, "\n".join(breaches)


def test_every_door_not_walked_for_the_trail_is_not_a_door():
    """Only what the authorization walk says is not a door (logging in and out, one's
    own password) goes unwalked here; an entry in UNAUDITED names a door there is."""
    left = sorted(set(EXPECTED) - set(AUDITED_DOORS))
    assert all(isinstance(EXPECTED[d], NotADoor) for d in left), left
    assert not set(UNAUDITED) - set(EXPECTED), sorted(set(UNAUDITED) - set(EXPECTED))
