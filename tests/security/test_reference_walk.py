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
one without a walk here. Every door walked is a door of the authorization walk's list.

Each (field, door) is walked in a savepoint, with the database's rows compared before
and after, as:

- a member of team research holding every permission but ``fleet.manage_all_teams``,
  pointing research's object at team vision's (or past research's bound): nothing
  changes, and the refusal names the team (or says the field's own rule);
- for each permission a member may hold on teams' things (every permission of a
  model, profile, adapter, API key, replica or team but views and
  ``manage_all_teams``: found from the permission table), a member of research with
  the views and that one permission, doing the same: nothing changes;
- the first member again, pointing at research's own object or the fleet's shared
  one (or within the bound; a team's capacity rights: someone who manages every
  team): the field is written, so a walk that changes nothing cannot pass. Where
  nothing of one's own could be named (a profile belongs to its model for life), the
  walk says why and its refusal must say the rule.

The count of fields, doors and walks is in the run's summary (tests/security/summary.py).
"""

from __future__ import annotations

import html
import io
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest
from django.apps import apps
from django.contrib import admin
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group, Permission
from django.contrib.contenttypes.models import ContentType
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection, transaction
from django.test import Client, RequestFactory
from django.test.utils import CaptureQueriesContext
from django.urls import URLPattern, URLResolver, get_resolver, reverse

from fleet.models import Adapter, ApiKey, EngineProfile, Model, Replica, Team
from fleet.services import api_keys, reach
from fleet.services import catalog as catalog_service
from fleet.services.teams import MANAGE_ALL
from tests.admin.helpers import form_data
from tests.factories import add_model
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
CATALOG_DOORS = ("api:CatalogViewSet.apply", "command:apply")
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
    small: Model  # research's too
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
        user = User.objects.create_user(f"member{self.made}", is_staff=True)
        user.user_permissions.set([self.perms[n] for n in names])
        teams = (self.w.mine, self.w.also) if teams is None else teams
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


# ---- what a door answered ----

ERRORLIST = re.compile(r'<ul class="errorlist[^"]*"[^>]*>(.*?)</ul>', re.S)
TAG = re.compile(r"<[^>]+>")


def _strings(value) -> list[str]:
    if isinstance(value, dict):
        return [s for v in value.values() for s in _strings(v)]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    return [str(value)]


def answer(resp) -> str:
    """The status and what a refusal says: a JSON body's strings, an admin form's errors."""
    kind = resp.get("Content-Type", "")
    body = resp.content.decode(errors="replace")
    if kind.startswith("application/json"):
        said = " ".join(_strings(json.loads(body))) if body else ""
    elif resp.status_code == 200 and kind.startswith("text/html"):
        said = " ".join(html.unescape(TAG.sub(" ", e)) for e in ERRORLIST.findall(body))
    else:
        said = ""
    return f"{resp.status_code} {' '.join(said.split())}"


# ---- doors ----
#
# ``go(w, user, target)``: make the change through the door as ``user``; ``target`` is
# "theirs" (vision's object, or past the bound) or "own" (research's, the fleet's, within
# the bound). Returns what the door said.


def api(method: str, path, body) -> Callable:
    def go(w, user, t):
        url = path(w) if callable(path) else path
        resp = getattr(w.client(user), method)(
            url, json.dumps(body(w, t)), content_type="application/json"
        )
        return answer(resp)

    return go


def admin_form(view: str, label: str, changes, obj=None) -> Callable:
    def go(w, user, t):
        app, name = label.split(".")
        url = reverse(f"admin:{app}_{name}_{view}", args=[obj(w).pk] if obj else [])
        data = w.form(url)
        data.update(changes(w, t) if callable(changes) else changes)
        return answer(w.client(user).post(url, data))

    return go


def admin_inline(prefix: str, row: dict, parent) -> Callable:
    """One more row of an inline (``prefix``: "profiles", "adapters") on a model's page."""

    def go(w, user, t):
        url = reverse("admin:fleet_model_change", args=[parent(w, t).pk])
        data = w.form(url)
        n = int(data[f"{prefix}-TOTAL_FORMS"])
        data[f"{prefix}-TOTAL_FORMS"] = str(n + 1)
        for key, value in list(data.items()):
            if key.startswith(f"{prefix}-__prefix__-"):
                data[key.replace("__prefix__", str(n))] = value
        data.update({f"{prefix}-{n}-{k}": v for k, v in row.items()})
        return answer(w.client(user).post(url, data))

    return go


def command(name: str, *args) -> Callable:
    def go(w, user, t):
        argv = [a(w, t) if callable(a) else a for a in args]
        try:
            call_command(
                name, *argv, "--as", user.get_username(), stdout=io.StringIO(), stderr=io.StringIO()
            )
        except CommandError as exc:
            return f"refused {exc}"
        return "done"

    return go


def catalog(text) -> dict[str, Callable]:
    """The two doors a catalog file goes through: the API and ``manage.py apply -f``."""

    def through_command(w, user, t):
        with open(w.catalog_file, "w", encoding="utf-8") as fh:
            fh.write(text(w, t))
        return command("apply", "-f", w.catalog_file)(w, user, t)

    return {
        "api:CatalogViewSet.apply": api(
            "post", "/api/v1/catalog/apply/", lambda w, t: {"catalog": text(w, t)}
        ),
        "command:apply": through_command,
    }


def models_url(obj) -> Callable:
    return lambda w: f"/api/v1/models/{obj(w).pk}/"


def entry(name: str, **fields) -> str:
    """A catalog file naming one model as it is, with ``fields``."""
    text = f"models:\n  - name: {name}\n"
    if name == "vit":
        text += "    team: vision\n    private: true\n"
    return text + "".join(f"    {k}: {json.dumps(v)}\n" for k, v in fields.items())


# ---- the walks ----

# What refusals say. A team rule names the team; a field's own rule says the rule.
THEIRS = "team 'vision'"
BOUND = ("team 'research'", "10")  # the team and its bound
NOT_OFFERED = "Select a valid choice"  # the admin's form offers only what the user may name
FORBIDDEN = "403"  # the whole page is refused: another team's model is read-only
OTHER_MODELS = "belongs to another model"
NO_PROFILE_YET = "a new model has no profile of its own yet: any profile named is another's"
FOR_LIFE = "a profile belongs to its model for life: it moves to no other model"


@dataclass
class Door:
    """One way to write a field through a door. ``needs``: the permissions the door asks
    for the change (a walker holding them all meets the field's rule, so its refusal must
    say ``says``). ``own`` False: nothing of one's own could be named here (``why``)."""

    door: str
    go: Callable
    needs: frozenset
    says: str | tuple  # each part in what it said
    name: str = ""
    own: bool = True
    why: str = ""
    value: Callable | None = None  # what the own walk writes, where not the field's


def door(door_id, go, *needs, says=THEIRS, **kw) -> Door:
    return Door(door_id, go, frozenset(needs), says, **kw)


@dataclass
class Field:
    value: Callable  # value(w, v): whether ``v`` is what a walk naming one's own writes
    walks: list[Door]
    by_manager: bool = False  # the own walk: whoever manages every team (a team's rights)


def as_api(v):
    return v.name if isinstance(v, Team) else v.pk if isinstance(v, EngineProfile) else v


def as_form(v) -> str | list:
    if hasattr(v, "pk"):
        return str(v.pk)
    return json.dumps(v) if isinstance(v, list) else str(v)


def as_file(v):
    return v.name if hasattr(v, "name") else v


def catalog_walks(text, *needs, **kw) -> list[Door]:
    return [door(d, go, *needs, **kw) for d, go in catalog(text).items()]


def model_walks(
    name,
    value,
    *,
    says=THEIRS,
    form_says=None,
    file_says=None,
    file_key=None,
    extra=None,
    new_own=True,
) -> list[Door]:
    """A model's field through every door that writes it: the API (create, update,
    partial update), the admin's add and change forms, a catalog file. ``value(w, t,
    new)``: what to name (an object, or a value), for a new model or for llama."""
    extra = extra or {}
    new = {} if new_own else {"own": False, "why": NO_PROFILE_YET}

    def body(w, t, new):
        fields = {"name": "fresh", "team": "research"} if new else {"name": "llama"}
        return {**fields, name: as_api(value(w, t, new)), **extra}

    def form(w, t, new):
        fields = {"name": "fresh", "team": str(w.mine.pk)} if new else {}
        return {**fields, name: as_form(value(w, t, new)), **{k: str(v) for k, v in extra.items()}}

    llama = models_url(lambda w: w.llama)
    key = file_key or name
    return [
        door(
            "api:ModelViewSet.create",
            api("post", "/api/v1/models/", lambda w, t: body(w, t, True)),
            "fleet.add_model",
            says=says,
            **new,
        ),
        door(
            "api:ModelViewSet.update",
            api("put", llama, lambda w, t: body(w, t, False)),
            "fleet.change_model",
            says=says,
        ),
        door(
            "api:ModelViewSet.partial_update",
            api("patch", llama, lambda w, t: body(w, t, False)),
            "fleet.change_model",
            says=says,
        ),
        door(
            "admin:fleet.model:add",
            admin_form("add", "fleet.model", lambda w, t: form(w, t, True)),
            "fleet.add_model",
            says=form_says or says,
            **new,
        ),
        door(
            "admin:fleet.model:change",
            admin_form("change", "fleet.model", lambda w, t: form(w, t, False), lambda w: w.llama),
            "fleet.change_model",
            says=form_says or says,
        ),
        *catalog_walks(
            lambda w, t: entry("llama", **{key: as_file(value(w, t, False)), **extra}),
            "fleet.change_model",
            says=file_says or says,
        ),
    ]


def key_walks(
    name, value, *, option, change=(), form=as_form, says=THEIRS, api_name=None
) -> list[Door]:
    """An API key's field: made through the API, the admin's form and the command, and
    changed through ``change`` (the API's "partial_update", the admin's "change");
    ``form(v)``: the admin form's value; ``api_name``: the API's name for it."""
    prefix = lambda w: f"/api/v1/api-keys/{w.key.prefix}/"  # noqa: E731
    body = {"name": "k", "team": "research"} if name != "team" else {"name": "k"}
    new = {"name": "k", "scope": "inference"}
    walks = [
        door(
            "api:ApiKeyViewSet.create",
            api(
                "post",
                "/api/v1/api-keys/",
                lambda w, t: {**body, api_name or name: as_api(value(w, t))},
            ),
            "fleet.add_apikey",
            says=says,
        ),
        door(
            "admin:fleet.apikey:add",
            admin_form(
                "add",
                "fleet.apikey",
                lambda w, t: {**new, "team": str(w.mine.pk), name: form(value(w, t))},
            ),
            "fleet.add_apikey",
            says=NOT_OFFERED if name == "team" else says,
        ),
        door(
            "command:create_api_key",
            command(
                "create_api_key",
                "k",
                *(("--team", "research") if name != "team" else ()),
                option,
                lambda w, t: option_value(value(w, t)),
            ),
            "fleet.add_apikey",
            says=says,
        ),
    ]
    if "partial_update" in change:
        walks.append(
            door(
                "api:ApiKeyViewSet.partial_update",
                api("patch", prefix, lambda w, t: {name: value(w, t)}),
                "fleet.change_apikey",
                says=says,
            )
        )
    if "change" in change:
        walks.append(
            door(
                "admin:fleet.apikey:change",
                admin_form(
                    "change",
                    "fleet.apikey",
                    lambda w, t: {name: form(value(w, t))},
                    lambda w: w.key,
                ),
                "fleet.change_apikey",
                says=says,
            )
        )
    return walks


def option_value(v) -> str:
    return ",".join(v) if isinstance(v, list) else as_file(v)


def capacity_walks(name: str, value, says: str) -> list[Door]:
    """A team's capacity right, set by a member of research who may change teams."""
    research = lambda w: f"/api/v1/teams/{w.mine.pk}/"  # noqa: E731
    theirs, ours = ("team 't2'", says), ("team 'research'", says)
    whole = {"name": "research", "group": "research", name: value}
    return [
        door(
            "api:TeamViewSet.create",
            api("post", "/api/v1/teams/", lambda w, t: {"name": "t2", name: value}),
            "fleet.add_team",
            says=theirs,
        ),
        door(
            "api:TeamViewSet.update",
            api("put", research, lambda w, t: whole),
            "fleet.change_team",
            says=ours,
        ),
        door(
            "api:TeamViewSet.partial_update",
            api("patch", research, lambda w, t: {name: value}),
            "fleet.change_team",
            says=ours,
        ),
        door(
            "admin:fleet.team:add",
            admin_form(
                "add",
                "fleet.team",
                lambda w, t: {"name": "t2", "group": str(w.spare_group.pk), name: str(value)},
            ),
            "fleet.add_team",
            says=theirs,
        ),
        door(
            "admin:fleet.team:change",
            admin_form("change", "fleet.team", {name: str(value)}, lambda w: w.mine),
            "fleet.change_team",
            says=ours,
        ),
    ]


def theirs_or(own: Callable) -> Callable:
    """vit's (vision's) object, or ``own(w)``."""
    return lambda w, t: w.vit if t == "theirs" else own(w)


PROFILE = {"name": "p2", "engine": "llamacpp", "model_path": "/m/x.gguf", "gpus_per_node": 0}
ADAPTER = {"name": "poet", "source": "/m/p.gguf"}


def profile_walks() -> list[Door]:
    cpu = lambda w: f"/api/v1/engine-profiles/{w.cpu.pk}/"  # noqa: E731
    moved = lambda w, t: {**PROFILE, "name": "cpu", "model": w.vit.pk}  # noqa: E731
    model = theirs_or(lambda w: w.llama)
    return [
        door(
            "api:EngineProfileViewSet.create",
            api(
                "post",
                "/api/v1/engine-profiles/",
                lambda w, t: {**PROFILE, "model": model(w, t).pk},
            ),
            "fleet.add_engineprofile",
        ),
        *(
            door(
                f"api:EngineProfileViewSet.{action}",
                api(method, cpu, moved),
                "fleet.change_engineprofile",
                says="create a new profile for another model",
                own=False,
                why=FOR_LIFE,
            )
            for action, method in (("update", "put"), ("partial_update", "patch"))
        ),
        door(
            "admin:fleet.engineprofile:add",
            admin_form(
                "add",
                "fleet.engineprofile",
                lambda w, t: {
                    **{k: str(v) for k, v in PROFILE.items()},
                    "model": str(model(w, t).pk),
                },
            ),
            "fleet.add_engineprofile",
            says=NOT_OFFERED,
        ),
        door(
            "admin:fleet.model:change",
            admin_inline("profiles", {k: str(v) for k, v in PROFILE.items()}, model),
            "fleet.change_model",
            "fleet.add_engineprofile",
            says=FORBIDDEN,
            name="a profile inline",
        ),
        *catalog_walks(
            lambda w, t: entry(
                model(w, t).name, profile=model(w, t).active_profile.name, profiles=[PROFILE]
            ),
            "fleet.add_engineprofile",
        ),
    ]


def adapter_walks() -> list[Door]:
    sql = lambda w: f"/api/v1/adapters/{w.sql.pk}/"  # noqa: E731
    base = theirs_or(lambda w: w.llama)
    moved = theirs_or(lambda w: w.small)  # within research: allowed
    whole = lambda w, t: {"name": "llama-sql", "source": "/m/sql.gguf", "model": moved(w, t).pk}  # noqa: E731
    return [
        door(
            "api:AdapterViewSet.create",
            api("post", "/api/v1/adapters/", lambda w, t: {**ADAPTER, "model": base(w, t).pk}),
            "fleet.add_adapter",
        ),
        door("api:AdapterViewSet.update", api("put", sql, whole), "fleet.change_adapter"),
        door(
            "api:AdapterViewSet.partial_update",
            api("patch", sql, lambda w, t: {"model": moved(w, t).pk}),
            "fleet.change_adapter",
        ),
        door(
            "admin:fleet.adapter:add",
            admin_form(
                "add", "fleet.adapter", lambda w, t: {**ADAPTER, "model": str(base(w, t).pk)}
            ),
            "fleet.add_adapter",
            says=NOT_OFFERED,
        ),
        door(
            "admin:fleet.adapter:change",
            admin_form(
                "change",
                "fleet.adapter",
                lambda w, t: {"model": str(moved(w, t).pk)},
                lambda w: w.sql,
            ),
            "fleet.change_adapter",
            says=NOT_OFFERED,
        ),
        door(
            "admin:fleet.model:change",
            admin_inline("adapters", ADAPTER, base),
            "fleet.change_model",
            "fleet.add_adapter",
            says=FORBIDDEN,
            name="an adapter inline",
        ),
        *catalog_walks(
            lambda w, t: entry(base(w, t).name, adapters=[ADAPTER]), "fleet.add_adapter"
        ),
        *catalog_walks(
            lambda w, t: entry("llama", adapters=[{"name": "vit-sql", "source": "/m/v.gguf"}]),
            "fleet.change_adapter",
            says="belongs to model 'vit'; an adapter keeps its base",
            name="their adapter under our model",
            own=False,
            why="an adapter keeps its base model in a catalog file, one's own too",
        ),
    ]


def their_profile_or_fp8(w, t, new):
    """Vision's profile, or llama's second one (a new model has none of its own)."""
    return w.vit_cpu if t == "theirs" or new else w.fp8


def pick(theirs, own) -> Callable:
    return lambda w, t, *new: theirs if t == "theirs" else own


FIELDS: dict[str, Field] = {
    "fleet.model.team": Field(
        value=lambda w, v: v in (w.mine.pk, w.also.pk),
        walks=model_walks(
            "team",
            # A new model is research's; llama moves to labs, the walkers' other team.
            lambda w, t, new: w.theirs if t == "theirs" else w.mine if new else w.also,
            form_says=NOT_OFFERED,
        ),
    ),
    "fleet.model.active_profile": Field(
        value=lambda w, v: v == w.fp8.pk,
        walks=model_walks(
            "active_profile",
            their_profile_or_fp8,
            says=OTHER_MODELS,
            form_says=NOT_OFFERED,  # the form offers the model's own profiles only
            file_says="no profile named 'vit-cpu' for this model",
            file_key="profile",
            new_own=False,
        ),
    ),
    "fleet.model.canary_profile": Field(
        value=lambda w, v: v == w.fp8.pk,
        walks=model_walks(
            "canary_profile",
            their_profile_or_fp8,
            says=OTHER_MODELS,
            file_says="no profile named 'vit-cpu' for this model",
            extra={"canary_percent": 10},
            new_own=False,
        ),
    ),
    "fleet.model.fallbacks": Field(
        value=lambda w, v: v == ["llama-small", "shared"],
        walks=model_walks("fallbacks", pick(["vit"], ["llama-small", "shared"])),
    ),
    "fleet.model.priority": Field(
        value=lambda w, v: v == 10,
        walks=model_walks("priority", pick(50, 10), says=BOUND),
    ),
    "fleet.engineprofile.model": Field(value=lambda w, v: v == w.llama.pk, walks=profile_walks()),
    "fleet.adapter.model": Field(
        value=lambda w, v: v in (w.llama.pk, w.small.pk), walks=adapter_walks()
    ),
    "fleet.apikey.team": Field(
        value=lambda w, v: v == w.mine.pk,
        walks=key_walks(
            "team", lambda w, t: w.theirs if t == "theirs" else w.mine, option="--team"
        ),
    ),
    "fleet.apikey.fallbacks": Field(
        value=lambda w, v: v == ["shared"],
        walks=key_walks(
            "fallbacks",
            pick(["vit"], ["shared"]),
            option="--fallbacks",
            change=("partial_update", "change"),
        ),
    ),
    "fleet.apikey.allowed_models": Field(
        value=lambda w, v: v == ["llama"],
        walks=[
            *key_walks(
                "allowed_models",
                pick(["vit"], ["llama"]),
                option="--models",
                change=("change",),
                form=list,
                api_name="models",
            ),
            # An adapter of a kept model is kept with it (docs/security.md, "Teams").
            door(
                "api:ApiKeyViewSet.create",
                api(
                    "post",
                    "/api/v1/api-keys/",
                    lambda w, t: {
                        "name": "k",
                        "team": "research",
                        "models": ["vit-sql"] if t == "theirs" else ["llama-sql"],
                    },
                ),
                "fleet.add_apikey",
                name="an adapter of their kept model",
                value=lambda w, v: v == ["llama-sql"],
            ),
        ],
    ),
    "fleet.team.max_priority": Field(
        value=lambda w, v: v == 50,
        walks=capacity_walks("max_priority", 50, "maximum priority"),
        by_manager=True,
    ),
    "fleet.team.guaranteed_gpu_memory_gb": Field(
        value=lambda w, v: v == 40,
        walks=capacity_walks("guaranteed_gpu_memory_gb", 40, "guaranteed GPU memory"),
        by_manager=True,
    ),
}

# Doors that write a walked field but can name nothing beyond the object itself.
NOT_A_REFERENCE_DOOR = {
    ("fleet.engineprofile.model", "admin:fleet.model:add"): "its inline's profiles are the "
    "new model's own",
    ("fleet.adapter.model", "admin:fleet.model:add"): "its inline's adapters are the new "
    "model's own",
}


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
