"""Every field that names another object, and every field that claims capacity, walked
through every door that writes it, as members who must not reach another team's.

The generated authorization walk (test_authorization_generated) asks "may this user
change this object?". This one asks "may this change point at what another team owns,
or claim more than the team's bound?" (docs/security.md, "Teams").

The fields are found, not listed: every concrete relation of an installed model to a
model, profile, adapter, team or API key (``_meta.get_fields()``), and beside them the
references the ORM cannot see: the JSON lists of model names (``NAME_LISTS``) and the
fields that claim capacity (``CAPACITY``: a model's priority, a team's rights from
``fleet.services.reach.CAPACITY_FIELDS``). A field found without a walk, or a walk of a
field that is gone, fails ``test_every_reference_field_is_walked``; a field no door
writes says so, and ``test_every_door_that_writes_a_field_is_walked`` holds it to that.
That test finds the doors that write a field as well (the API's model serializers, the
admin's add and change forms and their inlines, the catalog file's keys) and fails on
one without a walk (tests/security/reference_walks.py holds them, and what each refusal
says). Every door walked is a door of the authorization walk's list.

Each (field, door) is walked in a savepoint rolled back after, its rows compared with
those every try starts from (a try that sent the database no write changed nothing and
is not compared), as:

- a member of team research holding every permission but ``fleet.manage_all_teams``,
  pointing research's object at team vision's (or past research's bound): nothing
  changes, and the refusal names the team (or says the field's own rule);
- for each permission a member may hold on teams' things (every permission of a
  model, profile, adapter, API key, replica or team but views and
  ``manage_all_teams``: found from the permission table), a member of research with
  the views and that one permission, doing the same: nothing changes (and one holding
  what the door asks is refused as the first is);
- the first member again, pointing at research's own object or the fleet's shared
  one (or within the bound; a team's capacity rights: someone who manages every
  team): the field is written, so a walk that changes nothing cannot pass. Where
  nothing of one's own could be named (a profile belongs to its model for life), the
  walk says why and its refusal must say the rule.

The count of fields, doors and walks is in the run's summary (tests/security/summary.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import pytest
from auditlog.context import disable_auditlog
from django.apps import apps
from django.contrib import admin
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group, Permission
from django.contrib.contenttypes.models import ContentType
from django.db import connection, transaction
from django.test import Client, RequestFactory
from django.test.utils import CaptureQueriesContext
from django.urls import URLPattern, URLResolver, get_resolver

from fleet.models import Adapter, ApiKey, EngineProfile, Model, Replica, Team
from fleet.services import api_keys, reach
from fleet.services import catalog as catalog_service
from fleet.services.teams import MANAGE_ALL
from tests.admin.helpers import form_data
from tests.factories import add_model
from tests.security.reference_walks import CATALOG_DOORS, FIELDS, NOT_A_REFERENCE_DOOR
from tests.security.test_authorization_generated import (
    EXPECTED,
    NOISE_MODELS,
    Diff,
    diff,
    snapshot,
)

pytestmark = pytest.mark.django_db

# ---- the fields, found ----

# What a reference may name: what teams own, and teams themselves.
TARGETS = (Model, EngineProfile, Adapter, Team, ApiKey)
# References the ORM cannot see: lists of model names in JSON.
NAME_LISTS = {"fleet.model.fallbacks", "fleet.apikey.fallbacks", "fleet.apikey.allowed_models"}
# Fields that claim the fleet's capacity: bounded per team, or set only by whoever
# manages every team.
CAPACITY = {"fleet.model.priority", *(f"fleet.team.{name}" for name in reach.CAPACITY_FIELDS)}
# References no door writes: the control plane's own rows. The door test checks the claim.
WRITTEN_BY_NO_DOOR = {
    "fleet.replica.model": "replicas are the reconciler's: read-only in the admin and the API",
    "fleet.replica.profile": "replicas are the reconciler's: read-only in the admin and the API",
    "fleet.event.model": "events are the control plane's decisions: read-only",
    "fleet.keyusage.key": "usage rows are the gateways' counts: read-only",
    # The Batch API's rows take their key and team from the key a client's request
    # carries (/v1/files, /v1/batches), never from a field it sends; read-only in the admin.
    "fleet.batch.api_key": "a batch's key is the one that created it: read-only",
    "fleet.batch.team": "a batch's team is its key's: read-only",
    # Costs (fleet.services.costs): the accrual's rows, named after what held the GPUs.
    "fleet.costhour.model": "cost hours are the accrual's counts: read-only",
    "fleet.costhour.team": "cost hours are the accrual's counts: read-only",
    "fleet.batchfile.api_key": "a batch file's key is the one that uploaded it: read-only",
    "fleet.batchfile.team": "a batch file's team is its key's: read-only",
}


def reference_fields() -> set[str]:
    """Every concrete relation of an installed model to one of ``TARGETS``."""
    found = set()
    for model in apps.get_models():
        for f in model._meta.get_fields():
            if f.concrete and f.is_relation and f.related_model in TARGETS:
                found.add(f"{model._meta.label_lower}.{f.name}")
    return found


def model_field(label: str):
    app, model, name = label.split(".")
    return apps.get_model(app, model)._meta.get_field(name)


# ---- the doors that write a field, found ----

WRITE_ACTIONS = ("create", "update", "partial_update")
# A catalog file's keys that name other objects (the rest are MODEL_KEYS).
CATALOG_REFERENCES = {
    "team": "fleet.model.team",
    "profile": "fleet.model.active_profile",
    "canary_profile": "fleet.model.canary_profile",
    "profiles": "fleet.engineprofile.model",
    "adapters": "fleet.adapter.model",
}


def _viewsets(patterns):
    for p in patterns:
        if isinstance(p, URLResolver):
            yield from _viewsets(p.url_patterns)
        elif isinstance(p, URLPattern) and getattr(p.callback, "actions", None) is not None:
            yield p.callback.cls, p.callback.actions.values()


def api_writers(label: str) -> set[str]:
    """The API routes whose model serializer takes ``label`` as input."""
    f = model_field(label)
    doors = set()
    for cls, actions in _viewsets(get_resolver().url_patterns):
        serializer_class = getattr(cls, "serializer_class", None)
        meta = getattr(serializer_class, "Meta", None)
        if meta is None or getattr(meta, "model", None) is not f.model:
            continue
        writable = {
            s.source for s in serializer_class().fields.values() if not s.read_only and s.source
        }
        if f.name in writable:
            doors |= {f"api:{cls.__name__}.{a}" for a in actions if a in WRITE_ACTIONS}
    return doors


def admin_writers(label: str, superuser) -> set[str]:
    """The admin's add and change forms (a superuser's) that take ``label``, and the parent
    pages whose inlines make rows that point at the parent through it."""
    f = model_field(label)
    request = RequestFactory().get("/admin/")
    request.user = superuser
    doors = set()
    for model, model_admin in (
        (m, admin.site.get_model_admin(m)) for m in apps.get_models() if admin.site.is_registered(m)
    ):
        parent = model._meta.label_lower
        if model is f.model:
            obj = model.objects.first()
            views = (("add", None), ("change", obj))
            for view, instance in views:
                allowed = (
                    model_admin.has_add_permission(request)
                    if view == "add"
                    else instance is not None
                    and model_admin.has_change_permission(request, instance)
                )
                if not allowed:
                    continue
                form = model_admin.get_form(request, instance, change=view == "change")
                if f.name in form.base_fields:
                    doors.add(f"admin:{parent}:{view}")
        for inline in model_admin.get_inline_instances(request):
            if inline.model is f.model and f.is_relation and f.related_model is model:
                doors |= {f"admin:{parent}:add", f"admin:{parent}:change"}
    return doors


def catalog_writes(label: str) -> bool:
    model_keys = {f"fleet.model.{name}" for name in catalog_service.MODEL_KEYS.values()}
    return label in model_keys or label in CATALOG_REFERENCES.values()


def writers(label: str, superuser) -> set[str]:
    found = api_writers(label) | admin_writers(label, superuser)
    if catalog_writes(label):
        found |= set(CATALOG_DOORS)
    return found


# ---- the world ----


@dataclass
class RefWorld:
    root: object
    mine: Team  # research: the walkers' team, maximum priority 10
    also: Team  # labs: the walkers' second team, for a model moved within their own
    theirs: Team  # vision: the other team
    llama: Model  # research's, active profile "cpu", a second profile "fp8"
    small: Model  # research's too, at its maximum priority (10)
    shared: Model  # the fleet's (no team)
    vit: Model  # vision's, kept to its keys (private)
    cpu: EngineProfile
    fp8: EngineProfile
    vit_cpu: EngineProfile
    sql: Adapter  # llama's
    vit_sql: Adapter  # vit's
    key: ApiKey  # research's inference key
    spare_group: Group  # for a team made through the admin
    catalog_file: str
    clients: dict = field(default_factory=dict)
    forms: dict = field(default_factory=dict)

    def client(self, user) -> Client:
        if user.pk not in self.clients:
            self.clients[user.pk] = Client()
            self.clients[user.pk].force_login(user)
        return self.clients[user.pk]

    def form(self, url: str) -> dict:
        """The admin's form at ``url`` as the superuser's browser would post it back."""
        if url not in self.forms:
            self.forms[url] = form_data(self.client(self.root).get(url).content.decode())
        return dict(self.forms[url])


def _team(name: str, **fields) -> Team:
    # Its group grants nothing: what a walker may do is its own permissions, below.
    return Team.objects.create(name=name, group=Group.objects.create(name=name), **fields)


@pytest.fixture
def rw(settings, tmp_path) -> RefWorld:
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    root = get_user_model().objects.create_superuser("root", password="pw-for-tests")
    research, labs, vision = _team("research", max_priority=10), _team("labs"), _team("vision")
    cpu = {"engine": "llamacpp", "gpus_per_node": 0, "profile": "cpu"}
    llama, small = add_model("llama", **cpu), add_model("llama-small", **cpu)
    shared = add_model("shared", **cpu)
    vit = add_model("vit", **{**cpu, "profile": "vit-cpu"})
    Model.objects.filter(pk__in=[llama.pk, small.pk]).update(team=research)
    Model.objects.filter(pk=small.pk).update(priority=10)  # research's maximum
    Model.objects.filter(pk=vit.pk).update(team=vision, private=True)
    fp8 = EngineProfile.objects.create(
        model=llama, name="fp8", engine="llamacpp", model_path="/models/llama-fp8"
    )
    key, _ = api_keys.create_api_key("research-ci", team=research)
    w = RefWorld(
        root=root,
        mine=research,
        also=labs,
        theirs=vision,
        llama=Model.objects.get(pk=llama.pk),
        small=Model.objects.get(pk=small.pk),
        shared=shared,
        vit=Model.objects.get(pk=vit.pk),
        cpu=llama.active_profile,
        fp8=fp8,
        vit_cpu=vit.active_profile,
        sql=Adapter.objects.create(name="llama-sql", model=llama, source="/m/sql.gguf"),
        vit_sql=Adapter.objects.create(name="vit-sql", model=vit, source="/m/vit-sql.gguf"),
        key=key,
        spare_group=Group.objects.create(name="t2"),
        catalog_file=str(tmp_path / "catalog.yaml"),
    )
    w.client(root)  # logged in outside every walk's savepoint: a login writes
    return w


# ---- walkers ----

# The kinds whose permissions a team's member may hold: what teams own, and teams.
TEAM_KINDS = (Model, EngineProfile, Adapter, ApiKey, Replica, Team)


def member_permissions() -> list[str]:
    """Every permission on what teams own and on teams, but views and manage_all_teams."""
    kinds = ContentType.objects.get_for_models(*TEAM_KINDS).values()
    names = (
        f"{p.content_type.app_label}.{p.codename}"
        for p in Permission.objects.filter(content_type__in=kinds).select_related("content_type")
    )
    return sorted(n for n in names if ".view_" not in n and n != MANAGE_ALL)


@dataclass
class Walker:
    who: str
    user: object
    perms: frozenset


class Members:
    """Staff users of research and labs with some permissions, made as a walk needs them."""

    def __init__(self, w: RefWorld):
        self.w = w
        self.perms = {
            f"{p.content_type.app_label}.{p.codename}": p
            for p in Permission.objects.select_related("content_type")
        }
        self.views = frozenset(n for n in self.perms if n.split(".")[1].startswith("view_"))
        self.made = 0

    def make(self, who: str, names, teams=None) -> Walker:
        User = get_user_model()
        self.made += 1
        teams = (self.w.mine, self.w.also) if teams is None else teams
        # Made outside every walk, so unrecorded: recording hundreds of permissions names
        # each with a query of its own.
        with disable_auditlog():
            user = User.objects.create_user(f"member{self.made}", is_staff=True)
            user.user_permissions.set([self.perms[n] for n in names])
            user.groups.set([t.group for t in teams])
        user = User.objects.get(pk=user.pk)  # fresh: permissions are cached on the object
        self.w.client(user)  # logged in now, outside every walk's savepoint: a login writes
        return Walker(who, user, frozenset(names))

    def every_but_manage_all(self) -> Walker:
        names = set(self.perms) - {MANAGE_ALL}
        return self.make(f"every permission but {MANAGE_ALL}", names)

    def single(self, perm: str) -> Walker:
        return self.make(f"the views and {perm} only", self.views | {perm})

    def manager(self) -> Walker:
        return self.make("every permission, in no team", set(self.perms), teams=())


# ---- running a walk ----


# Statements that write, and the tables whose writes are visits, not changes.
WRITES = ("INSERT", "UPDATE", "DELETE", "REPLACE")
NOISE_TABLES = {apps.get_model(label)._meta.db_table for label in NOISE_MODELS}


def _writes(sql: str) -> bool:
    words = sql.lstrip().split(None, 3)
    if not words or words[0].upper() not in WRITES:
        return False
    table = next((w for w in words[1:] if w.upper() not in ("INTO", "FROM")), "")
    return table.strip('"`') not in NOISE_TABLES


def attempt(w: RefWorld, go: Callable, user, target: str, baseline: dict) -> tuple[Diff, str]:
    """``go`` as ``user`` in a savepoint rolled back after: what it changed against
    ``baseline`` (the rows every try starts from), and what it said. A try that sent no
    write is not snapshotted: it changed nothing."""
    with transaction.atomic():
        with CaptureQueriesContext(connection) as queries:
            said = go(w, user, target)
        wrote = any(_writes(q["sql"]) for q in queries.captured_queries)
        changed = diff(baseline, snapshot()) if wrote else Diff()
        transaction.set_rollback(True)
    return changed, said


def says(said: str, what: str | tuple) -> bool:
    return all(part in said for part in ((what,) if isinstance(what, str) else what))


def written(d: Diff, label: str, wanted: Callable) -> bool:
    """Whether ``d`` added a row, or changed one, whose ``label`` field now holds what
    ``wanted`` takes."""
    f = model_field(label)
    rows = f.model._meta.label_lower
    if any(wanted(row[f.attname]) for row in d.added.get(rows, {}).values()):
        return True
    return any(
        before[f.attname] != after[f.attname] and wanted(after[f.attname])
        for before, after in d.changed.get(rows, {}).values()
    )


def walk_field(w: RefWorld, label: str) -> tuple[list[str], int]:
    """Every door of ``label``'s walks, as every walker; returns the breaches and the tries."""
    spec = FIELDS[label]
    members = Members(w)
    strongest = members.every_but_manage_all()
    walkers = [strongest, *(members.single(p) for p in member_permissions())]
    builder = members.manager() if spec.by_manager else strongest
    baseline = snapshot()  # every try starts here: each is rolled back
    breaches, tries = [], 0
    for d in spec.walks:
        where = f"{label} through {d.door}{f' ({d.name})' if d.name else ''}"
        for walker in walkers:
            changed, said = attempt(w, d.go, walker.user, "theirs", baseline)
            tries += 1
            if changed:
                breaches.append(f"{where}: a member with {walker.who} reached it: {changed}")
            elif d.needs <= walker.perms and not says(said, d.says):
                breaches.append(
                    f"{where}: a member with {walker.who} was refused without {d.says!r}: {said}"
                )
        if not d.own:
            assert d.why, f"{where}: a walk with no own case says why"
            continue
        wanted = d.value or spec.value
        changed, said = attempt(w, d.go, builder.user, "own", baseline)
        tries += 1
        if not written(changed, label, lambda v, wanted=wanted: wanted(w, v)):
            breaches.append(
                f"{where}: {builder.who} naming their own made no such change "
                f"({changed or 'nothing'}; {said}): the walk proves nothing"
            )
    return breaches, tries


# ---- the tests ----


def test_every_reference_field_is_walked(record_property):
    """A reference field added later without a walk fails; so does a walk of one gone."""
    found = reference_fields() | NAME_LISTS | CAPACITY
    known = set(FIELDS) | set(WRITTEN_BY_NO_DOOR)
    record_property(
        "reference_fields", {"walked": len(FIELDS), "written_by_no_door": len(WRITTEN_BY_NO_DOOR)}
    )
    assert not found - known, f"reference fields with no walk: {sorted(found - known)}"
    assert not known - found, f"walks of fields that are gone: {sorted(known - found)}"
    assert not set(FIELDS) & set(WRITTEN_BY_NO_DOOR)


def test_every_door_that_writes_a_field_is_walked(rw):
    """The doors that write each field, found (API model serializers, admin forms and their
    inlines, catalog keys), each walked; a field said to be written by no door is not."""
    missing, stale = [], []
    for label in sorted(set(FIELDS) | set(WRITTEN_BY_NO_DOOR)):
        found = writers(label, rw.root)
        if label in WRITTEN_BY_NO_DOOR:
            assert not found, f"{label} is written by {sorted(found)}, not by no door"
            continue
        walked = {d.door for d in FIELDS[label].walks}
        exempt = {door for (f, door) in NOT_A_REFERENCE_DOOR if f == label}
        missing += [f"{label} through {door}" for door in sorted(found - walked - exempt)]
        stale += [f"{label} through {door}" for door in sorted(exempt - found)]
    assert not missing, f"doors that write a reference field with no walk: {missing}"
    assert not stale, f"NOT_A_REFERENCE_DOOR entries for doors that do not write it: {stale}"
    walked = {d.door for f in FIELDS.values() for d in f.walks}
    assert not walked - set(EXPECTED), (
        f"walked doors the authorization walk does not know: {sorted(walked - set(EXPECTED))}"
    )


@pytest.mark.parametrize("label", sorted(FIELDS))
def test_reference_walk(rw, label, record_property):
    breaches, tries = walk_field(rw, label)
    doors = sorted({d.door for d in FIELDS[label].walks})
    record_property(
        "reference_walk",
        {"field": label, "doors": doors, "walks": len(FIELDS[label].walks), "tries": tries},
    )
    print(
        f"reference walk: {label}: {len(doors)} doors, {len(FIELDS[label].walks)} walks, "
        f"{tries} tries"
    )
    assert not breaches, "\n".join(breaches)
