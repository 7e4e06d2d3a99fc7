"""Every write door, generated from the URL conf, the admin registry and the command list,
walked as users who should not be able to make its change.

The doors are found, not listed: every URL pattern that takes POST, PUT, PATCH or
DELETE (the API's routes and custom actions, the console, the admin's own pages),
every registered ModelAdmin's add, change and delete views and every action its
``get_actions`` offers, and every management command of the fleet app. Each must
have an entry in ``EXPECTED`` (a door added later without one fails
``test_every_write_door_has_an_expectation``) saying which walks make its change
and which permissions each needs — or that it changes nothing, which is walked
too, as a user holding every permission.

Each walk runs on the same small fleet in its own savepoint, with the database's
rows snapshotted before and after (``last_login`` and ``auto_now`` dates aside),
as:

- a staff user with every view permission and nothing else: no change;
- for each permission X the walk needs, a staff user with every permission but X:
  no change. Django's permissions only add, so this covers every user with any
  single permission other than X — and with any set that lacks X;
- a staff user with exactly what it needs (and the views): the change happens, so
  a walk that changes nothing cannot pass for a refusal.

"Change" is any row added, removed or altered, except where a walk says which
change is the forbidden one (a key minted for someone else, not one's own).
"""

from __future__ import annotations

import io
import itertools
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta

import pytest
from auditlog.context import disable_auditlog
from axes.models import AccessAttempt, AccessFailureLog, AccessLog
from django.apps import apps
from django.contrib import admin
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group, Permission
from django.core.management import call_command, get_commands
from django.core.management.base import CommandError
from django.db import connection, transaction
from django.test import Client
from django.urls import URLPattern, URLResolver, get_resolver, reverse
from django.utils import timezone

from fleet.console import node_actions
from fleet.models import (
    ApiKey,
    EngineProfile,
    Event,
    JoinToken,
    LocalWeights,
    Model,
    Node,
    Price,
    Team,
    WantedEngine,
)
from fleet.services import api_keys
from fleet.services.permissions import ARGS_ENV, OTHERS_API_KEYS
from fleet.services.teams import MANAGE_ALL as MANAGE_ALL_TEAMS
from tests.admin.helpers import form_data
from tests.factories import add_model, join_token, node_with_weights

pytestmark = pytest.mark.django_db

WRITE_METHODS = ("post", "put", "patch", "delete")
# Rows that record a visit, not a change: a login's session, the admin's history.
NOISE_MODELS = {"sessions.session", "admin.logentry"}
NOISE_FIELDS = {"last_login", "last_used_at"}


# ---- the doors, found ------------------------------------------------------------------------


def _patterns(patterns, namespace=None):
    for p in patterns:
        if isinstance(p, URLResolver):
            yield from _patterns(p.url_patterns, p.namespace or namespace)
        elif isinstance(p, URLPattern):
            yield namespace, p


def url_doors() -> set[str]:
    """Every URL pattern that takes a write method, but the ModelAdmins' (admin_doors)."""
    doors = set()
    for namespace, p in _patterns(get_resolver().url_patterns):
        cb = p.callback
        if getattr(cb, "model_admin", None) is not None:
            continue  # the registry's doors, below
        actions = getattr(cb, "actions", None)
        if actions is not None:  # a DRF viewset's route
            doors |= {
                f"api:{cb.cls.__name__}.{a}" for m, a in actions.items() if m in WRITE_METHODS
            }
            continue
        view_class = getattr(cb, "view_class", None) or getattr(cb, "cls", None)
        if view_class is not None and not any(hasattr(view_class, m) for m in WRITE_METHODS):
            continue  # a class-based view that answers no write method
        # A function view may take anything: it is a door until its entry says otherwise.
        doors.add(f"url:{namespace or ''}:{p.name or str(p.pattern)}")
    return doors


def _superuser_request(user):
    from django.test import RequestFactory

    request = RequestFactory().get("/admin/")
    request.user = user
    return request


def registered_admins():
    return [
        (m, admin.site.get_model_admin(m)) for m in apps.get_models() if admin.site.is_registered(m)
    ]


def admin_doors(superuser) -> set[str]:
    """Each ModelAdmin's add, change and delete views, and every action it offers."""
    request = _superuser_request(superuser)
    doors = set()
    for model, model_admin in registered_admins():
        label = model._meta.label_lower
        doors |= {f"admin:{label}:{view}" for view in ("add", "change", "delete")}
        doors |= {f"admin:{label}:action:{name}" for name in model_admin.get_actions(request)}
    return doors


def command_doors() -> set[str]:
    return {f"command:{name}" for name, app in get_commands().items() if app == "fleet"}


# ---- the world every walk starts from --------------------------------------------------------


@dataclass
class World:
    root: object
    bystander: object
    group: Group
    node: Node  # with weights, a shard and a credential
    bare_node: Node  # nothing hangs on it: deletable
    model: Model
    replica: object  # the node's shard's
    profile: EngineProfile
    spare: Model  # no replicas: deletable
    spare_profile: EngineProfile
    engine: WantedEngine
    weights: LocalWeights
    token: JoinToken
    root_key: ApiKey
    event: Event
    team: object = None  # a team of its own group, owning team_model
    team_model: Model | None = None
    adapter: object = None  # a LoRA adapter of spare
    team_adapter: object = None  # one of team_model
    catalog_file: str = ""
    prepared: object = None  # what the walk's prepare() made
    seq: itertools.count = field(default_factory=itertools.count)


@pytest.fixture
def world(settings, tmp_path) -> World:
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    _CLIENTS.clear()
    User = get_user_model()
    root = User.objects.create_superuser("root", password="pw-for-tests")
    bystander = User.objects.create_user("bystander", password="pw-for-tests", is_staff=True)
    group = Group.objects.create(name="operators")
    shard = node_with_weights("n1")
    node = shard.node
    from fleet.models import NodeCredential

    NodeCredential.issue(node=node)
    model = shard.replica.model
    spare = add_model("spare", engine="llamacpp", gpus_per_node=0)
    weights = LocalWeights.objects.get(node=node, path__endswith="/old")
    LocalWeights.objects.filter(pk=weights.pk).update(
        unused_since=timezone.now() - timedelta(days=30)
    )
    root_key, _ = api_keys.create_api_key("root's", scope="manage", user=root)
    token, _ = join_token()
    catalog = tmp_path / "catalog.yaml"
    team = Team.objects.create(name="research", group=Group.objects.create(name="research"))
    # A price in force, for the price pages nobody may change or delete to be tried on.
    Price.objects.create(gpu_class="H100", per_hour=2, effective_from=timezone.now())
    team_model = add_model("theirs", engine="llamacpp", gpus_per_node=0)
    Model.objects.filter(pk=team_model.pk).update(team=team)
    team_model.refresh_from_db()
    from fleet.models import Adapter

    return World(
        adapter=Adapter.objects.create(name="spare-sql", model=spare, source="/m/sql.gguf"),
        team_adapter=Adapter.objects.create(
            name="theirs-sql", model=team_model, source="/m/t.gguf"
        ),
        team=team,
        team_model=team_model,
        root=root,
        bystander=bystander,
        group=group,
        node=node,
        bare_node=Node.objects.create(pk="bare"),
        model=model,
        replica=shard.replica,
        profile=model.active_profile,
        spare=spare,
        spare_profile=spare.active_profile,
        engine=WantedEngine.objects.create(engine="vllm", version="0.11.0"),
        weights=weights,
        token=token,
        root_key=root_key,
        event=Event.objects.create(
            created_at=timezone.now(), kind="scale", model_name="spare", reason="test"
        ),
        catalog_file=str(catalog),
    )


# ---- walks ---------------------------------------------------------------------------------


@dataclass
class Walk:
    """One way through a door: ``go(world, user)`` makes the change, as ``user``.

    ``needs``: every permission the change needs, view permissions aside (every
    walker has them). ``forbidden(diff, user)``: whether the diff holds the change
    this walk guards; by default, any change at all. ``prepare(world, user)`` runs
    before the snapshot (a key of the walker's own to rotate).
    """

    needs: frozenset
    go: Callable
    prepare: Callable | None = None
    forbidden: Callable | None = None
    name: str = ""


def with_canary(w, user) -> None:
    """The walk's model runs a canary: a second profile with a quarter of the requests."""
    profile = EngineProfile.objects.create(
        model=w.model,
        name=f"canary-{next(w.seq)}",
        engine=w.profile.engine,
        model_path=w.profile.model_path,
    )
    Model.objects.filter(pk=w.model.pk).update(canary_profile=profile, canary_percent=25)


def walk(*needs, go, prepare=None, forbidden=None, name=""):
    return Walk(frozenset(needs), go, prepare, forbidden, name)


@dataclass
class NoChange:
    """A door that takes a write method and must change nothing, whoever asks."""

    go: Callable
    why: str
    prepare: Callable | None = None


@dataclass
class NotADoor:
    """A write method that is not a permission's to guard (logging out, one's own password)."""

    why: str


# Logged-in clients, per user, for the test in hand (world() empties it): a login writes
# (a session, axes's log, axes's clean-up), so run() logs its walker in before the snapshot.
_CLIENTS: dict[int, Client] = {}


def client_of(user) -> Client:
    if user.pk not in _CLIENTS:
        client = Client()
        client.force_login(user)
        _CLIENTS[user.pk] = client
    return _CLIENTS[user.pk]


def api(method, path, body=None):
    def go(w, user):
        url = path(w) if callable(path) else path
        data = body(w) if callable(body) else body
        return getattr(client_of(user), method)(
            url, json.dumps(data) if data is not None else None, content_type="application/json"
        )

    return go


def admin_form(view, label, changes, obj=None):
    """Post the admin's form as a browser would, as the superuser saw it, with ``changes``."""

    def go(w, user):
        app, model = label.split(".")
        args = [obj(w).pk] if obj else []
        url = reverse(f"admin:{app}_{model}_{view}", args=args)
        data = form_data(client_of(w.root).get(url).content.decode())
        data.update(changes(w) if callable(changes) else changes)
        return client_of(user).post(url, data)

    return go


def admin_delete(label, obj):
    def go(w, user):
        app, model = label.split(".")
        url = reverse(f"admin:{app}_{model}_delete", args=[obj(w).pk])
        return client_of(user).post(url, {"post": "yes"})

    return go


def admin_action(label, action, objs):
    def go(w, user):
        app, model = label.split(".")
        return client_of(user).post(
            reverse(f"admin:{app}_{model}_changelist"),
            {"action": action, "_selected_action": [str(o.pk) for o in objs(w)], "post": "yes"},
        )

    return go


def command(name, *args):
    def go(w, user):
        argv = [a(w) if callable(a) else a for a in args]
        if user is not None:
            argv += ["--as", user.get_username()]
        try:
            call_command(name, *argv, stdout=io.StringIO(), stderr=io.StringIO())
        except CommandError:
            pass  # a refusal; the snapshot says whether anything changed

    return go


def expired_attempt(w, user):
    attempt = AccessAttempt.objects.create(
        username="x", ip_address="10.0.0.9", user_agent="t", failures_since_start=1
    )
    AccessAttempt.objects.filter(pk=attempt.pk).update(
        attempt_time=timezone.now() - timedelta(days=30)
    )
    return attempt


def cordoned(w, user):
    Node.objects.filter(pk=w.node.pk).update(cordoned=True)


# What a node action needs first to have something to change.
NODE_ACTION_PREPARE = {
    "uncordon": cordoned,
    "vllm-build-auto": lambda w, u: Node.objects.filter(pk=w.node.pk).update(vllm_build="none"),
}


def faulty_gpu(w, user):
    """A GPU of the walk's node that failed (XID 79), for a clear to change."""
    from fleet.models import GPU

    reason = "XID 79: GPU has fallen off the bus"
    return GPU.objects.create(
        node=w.node, index=7, uuid=f"GPU-walk-{next(w.seq)}", name="NVIDIA H100",
        memory_total_mb=81559, health="failed", health_reason=reason, fault="failed",
        fault_reason=reason, fault_at=timezone.now(),
    )  # fmt: skip


def gpu_clear_form(url):
    """The console's and the admin's clear: a form post with the reason."""

    def go(w, user):
        return client_of(user).post(url(w), {"reason": "reset; dcgmi diag passed"})

    return go


def own_key(w, user):
    key, _ = api_keys.create_api_key(f"own {next(w.seq)}", scope="manage", user=user)
    return key


def new_key_of_another(diff, user) -> bool:
    return any(row["user_id"] != user.pk for row in diff.added.get("fleet.apikey", {}).values())


def profile_args_changed(diff, user) -> bool:
    return any(
        "args" in cols or "env" in cols for cols in diff.changed_columns("fleet.engineprofile")
    )


def node_cordon_changed(diff, user) -> bool:
    return any({"cordoned", "draining"} & cols for cols in diff.changed_columns("fleet.node"))


CATALOG = """\
models:
  - name: {name}
    profiles:
      - name: cpu
        engine: llamacpp
        model_path: /models/x.gguf
        gpus_per_node: 0
{extra}"""


def catalog_text(name="fresh", extra=""):
    return CATALOG.format(name=name, extra=extra)


def write_catalog(text):
    def go(w, user):
        with open(w.catalog_file, "w", encoding="utf-8") as fh:
            fh.write(text)
        return command("apply", "-f", lambda w: w.catalog_file)(w, user)

    return go


# spare's only profile is "default" (tests.factories.add_model), on /models/spare.
SPARE = """\
models:
  - name: spare
    replicas: {replicas}
    profiles:
      - name: default
        engine: llamacpp
        model_path: {path}
        gpus_per_node: 0
"""
APPLY_WALKS = {
    "add": (("fleet.add_model", "fleet.add_engineprofile"), catalog_text()),
    "change profile": (
        ("fleet.change_engineprofile",),
        SPARE.format(replicas=1, path="/models/other"),
    ),
    "change model": (("fleet.change_model",), SPARE.format(replicas=3, path="/models/spare")),
    "args": (
        ("fleet.add_model", "fleet.add_engineprofile", ARGS_ENV),
        catalog_text(extra="        args: [--trust-remote-code]\n"),
    ),
    "engine": (("fleet.change_wantedengine",), "engines:\n  vllm: 0.12.0\n"),
    "price": (
        ("fleet.add_price",),
        "prices:\n  - gpu_class: H100\n    per_hour: 2.5\n    effective_from: 2026-11-01\n",
    ),
    "new engine": (("fleet.add_wantedengine",), "engines:\n  sglang: 0.5.0\n"),
}

P = "fleet."
KEY = ("fleet.change_apikey",)

EXPECTED: dict[str, list[Walk] | NoChange | NotADoor] = {
    # ---- the management API --------------------------------------------------------------
    **{
        f"api:NodeViewSet.{a}": [
            walk(
                P + perm,
                prepare=cordoned if a == "uncordon" else None,
                go=api("post", lambda w, a=a: f"/api/v1/nodes/{w.node.pk}/{a}/"),
            )
        ]
        for a, perm in (
            ("cordon", "drain_node"),
            ("drain", "drain_node"),
            ("uncordon", "drain_node"),
            ("revoke", "change_node"),
        )
    },
    **{
        f"api:ReplicaViewSet.{a}": [
            walk(
                "fleet.drain_replica",
                go=api("post", lambda w, a=a: f"/api/v1/replicas/{w.replica.pk}/{a}/"),
            )
        ]
        for a in ("drain", "stop", "restart")
    },
    "url:console:replica-action": [
        walk(
            "fleet.drain_replica",
            name=a,
            go=api(
                "post",
                lambda w, a=a: f"/admin/cluster/models/{w.model.pk}/replicas/{w.replica.pk}/{a}/",
            ),
        )
        for a in ("drain", "stop", "restart")
    ],
    **{
        f"admin:fleet.replica:action:{a}_replicas": [
            walk(
                "fleet.drain_replica",
                go=admin_action("fleet.replica", f"{a}_replicas", lambda w: [w.replica]),
            )
        ]
        for a in ("drain", "stop", "restart")
    },
    **{
        f"api:ModelViewSet.{a}": [
            walk(
                "fleet.change_model",
                prepare=with_canary,
                go=api("post", lambda w, path=path: f"/api/v1/models/{w.model.pk}/{path}/"),
            )
        ]
        for a, path in (("promote", "promote"), ("abort_canary", "abort-canary"))
    },
    **{
        f"admin:fleet.model:action:{a}": [
            walk(
                "fleet.change_model",
                prepare=with_canary,
                go=admin_action("fleet.model", a, lambda w: [w.model]),
            )
        ]
        for a in ("promote_canary", "abort_canary")
    },
    "api:NodeViewSet.vllm_build": [
        walk(
            "fleet.change_node",
            go=api(
                "post", lambda w: f"/api/v1/nodes/{w.node.pk}/vllm-build/", {"vllm_build": "cu13"}
            ),
        )
    ],
    "api:WantedEngineViewSet.create": [
        walk(
            "fleet.add_wantedengine",
            go=api("post", "/api/v1/engines/", {"engine": "sglang", "version": "0.5.0"}),
        )
    ],
    "api:WantedEngineViewSet.update": [
        walk(
            "fleet.change_wantedengine",
            go=api(
                "put",
                lambda w: f"/api/v1/engines/{w.engine.pk}/",
                {"engine": "vllm", "version": "0.12.0"},
            ),
        )
    ],
    "api:WantedEngineViewSet.partial_update": [
        walk(
            "fleet.change_wantedengine",
            go=api("patch", lambda w: f"/api/v1/engines/{w.engine.pk}/", {"version": "0.12.0"}),
        )
    ],
    "api:WantedEngineViewSet.destroy": [
        walk(
            "fleet.delete_wantedengine",
            go=api("delete", lambda w: f"/api/v1/engines/{w.engine.pk}/"),
        )
    ],
    "api:ModelViewSet.create": [
        walk("fleet.add_model", go=api("post", "/api/v1/models/", {"name": "fresh"}))
    ],
    "api:ModelViewSet.update": [
        walk(
            "fleet.change_model",
            go=api(
                "put",
                lambda w: f"/api/v1/models/{w.spare.pk}/",
                {"name": "spare", "desired_replicas": 3},
            ),
        )
    ],
    "api:ModelViewSet.partial_update": [
        walk(
            "fleet.change_model",
            go=api("patch", lambda w: f"/api/v1/models/{w.spare.pk}/", {"desired_replicas": 3}),
        ),
        # A team's model, to walkers in no team: the team's scope is one more permission.
        walk(
            "fleet.change_model",
            MANAGE_ALL_TEAMS,
            name="a team's",
            go=api(
                "patch", lambda w: f"/api/v1/models/{w.team_model.pk}/", {"desired_replicas": 3}
            ),
        ),
        walk(
            "fleet.change_model",
            MANAGE_ALL_TEAMS,
            name="given to a team",
            go=api("patch", lambda w: f"/api/v1/models/{w.spare.pk}/", {"team": "research"}),
        ),
    ],
    "api:ModelViewSet.destroy": [
        walk("fleet.delete_model", go=api("delete", lambda w: f"/api/v1/models/{w.spare.pk}/")),
        walk(
            "fleet.delete_model",
            MANAGE_ALL_TEAMS,
            name="a team's",
            go=api("delete", lambda w: f"/api/v1/models/{w.team_model.pk}/"),
        ),
    ],
    "api:TeamViewSet.create": [
        # Its group made with it, empty and granting nothing: no auth.add_group needed.
        walk("fleet.add_team", go=api("post", "/api/v1/teams/", {"name": "t"})),
        walk(
            "fleet.add_team",
            name="of a group there is",
            go=api("post", "/api/v1/teams/", {"name": "ops", "group": "operators"}),
        ),
    ],
    "api:TeamViewSet.update": [
        walk(
            "fleet.change_team",
            go=api(
                "put",
                lambda w: f"/api/v1/teams/{w.team.pk}/",
                {"name": "research", "group": "research", "max_gpus": 8},
            ),
        )
    ],
    "api:TeamViewSet.partial_update": [
        walk(
            "fleet.change_team",
            go=api("patch", lambda w: f"/api/v1/teams/{w.team.pk}/", {"max_gpus": 8}),
        ),
        # A budget in money is set as the token budget is: with the team.
        walk(
            "fleet.change_team",
            name="budget",
            go=api(
                "patch",
                lambda w: f"/api/v1/teams/{w.team.pk}/",
                {"budget_per_month": "1000", "budget_currency": "EUR"},
            ),
        ),
    ],
    # A price is history: set from a date on, never edited or deleted (no such routes).
    "api:PriceViewSet.create": [
        walk(
            "fleet.add_price",
            go=api(
                "post",
                "/api/v1/prices/",
                {"gpu_class": "H100", "per_hour": "2.50", "effective_from": "2026-11-01"},
            ),
        )
    ],
    "api:TeamViewSet.destroy": NoChange(
        api("delete", lambda w: f"/api/v1/teams/{w.team.pk}/"),
        "a team that owns models is kept (409): delete or move them first",
    ),
    "api:EngineProfileViewSet.create": [
        walk(
            "fleet.add_engineprofile",
            go=api(
                "post",
                "/api/v1/engine-profiles/",
                lambda w: {
                    "model": w.spare.pk,
                    "name": "p2",
                    "engine": "llamacpp",
                    "model_path": "/m/x.gguf",
                    "gpus_per_node": 0,
                },
            ),
        ),
        walk(
            "fleet.add_engineprofile",
            ARGS_ENV,
            name="with env",
            go=api(
                "post",
                "/api/v1/engine-profiles/",
                lambda w: {
                    "model": w.spare.pk,
                    "name": "p3",
                    "engine": "llamacpp",
                    "model_path": "/m/x.gguf",
                    "gpus_per_node": 0,
                    "env": {"LD_PRELOAD": "/tmp/x.so"},
                },
            ),
        ),
    ],
    "api:EngineProfileViewSet.update": [
        walk(
            "fleet.change_engineprofile",
            go=api(
                "put",
                lambda w: f"/api/v1/engine-profiles/{w.spare_profile.pk}/",
                lambda w: {
                    "model": w.spare.pk,
                    "name": w.spare_profile.name,
                    "engine": "llamacpp",
                    "model_path": "/m/y.gguf",
                    "gpus_per_node": 0,
                },
            ),
        )
    ],
    "api:EngineProfileViewSet.partial_update": [
        walk(
            "fleet.change_engineprofile",
            go=api(
                "patch",
                lambda w: f"/api/v1/engine-profiles/{w.spare_profile.pk}/",
                {"node_selector": "zone=b"},
            ),
        ),
        walk(
            "fleet.change_engineprofile",
            ARGS_ENV,
            name="args",
            go=api(
                "patch",
                lambda w: f"/api/v1/engine-profiles/{w.spare_profile.pk}/",
                {"args": ["--x"]},
            ),
        ),
    ],
    "api:EngineProfileViewSet.destroy": [
        walk(
            "fleet.delete_engineprofile",
            go=api("delete", lambda w: f"/api/v1/engine-profiles/{w.spare_profile.pk}/"),
        )
    ],
    "api:AdapterViewSet.create": [
        walk(
            "fleet.add_adapter",
            go=api(
                "post",
                "/api/v1/adapters/",
                lambda w: {"name": "spare-poet", "model": w.spare.pk, "source": "/m/poet.gguf"},
            ),
        ),
        walk(
            "fleet.add_adapter",
            MANAGE_ALL_TEAMS,
            name="to a team's model",
            go=api(
                "post",
                "/api/v1/adapters/",
                lambda w: {"name": "their-poet", "model": w.team_model.pk, "source": "/m/p.gguf"},
            ),
        ),
    ],
    "api:AdapterViewSet.update": [
        walk(
            "fleet.change_adapter",
            go=api(
                "put",
                lambda w: f"/api/v1/adapters/{w.adapter.pk}/",
                lambda w: {"name": "spare-sql", "model": w.spare.pk, "source": "/m/sql2.gguf"},
            ),
        )
    ],
    "api:AdapterViewSet.partial_update": [
        walk(
            "fleet.change_adapter",
            go=api("patch", lambda w: f"/api/v1/adapters/{w.adapter.pk}/", {"rank": 8}),
        ),
        walk(
            "fleet.change_adapter",
            MANAGE_ALL_TEAMS,
            name="a team's",
            go=api("patch", lambda w: f"/api/v1/adapters/{w.team_adapter.pk}/", {"rank": 8}),
        ),
    ],
    "api:AdapterViewSet.destroy": [
        walk(
            "fleet.delete_adapter", go=api("delete", lambda w: f"/api/v1/adapters/{w.adapter.pk}/")
        ),
        walk(
            "fleet.delete_adapter",
            MANAGE_ALL_TEAMS,
            name="a team's",
            go=api("delete", lambda w: f"/api/v1/adapters/{w.team_adapter.pk}/"),
        ),
    ],
    "api:CatalogViewSet.apply": [
        walk(*needs, name=n, go=api("post", "/api/v1/catalog/apply/", {"catalog": text}))
        for n, (needs, text) in APPLY_WALKS.items()
    ],
    "api:CatalogViewSet.explain": NoChange(
        api("post", "/api/v1/catalog/explain/", {"model": "fresh", "catalog": catalog_text()}),
        "a what-if: the file is applied in a transaction rolled back",
    ),
    "api:JoinTokenViewSet.create": [
        walk("fleet.add_jointoken", go=api("post", "/api/v1/join-tokens/", {"name": "t"}))
    ],
    "api:ApiKeyViewSet.create": [
        walk("fleet.add_apikey", go=api("post", "/api/v1/api-keys/", {"name": "k"})),
        walk(
            "fleet.add_apikey",
            OTHERS_API_KEYS,
            name="for another",
            go=api("post", "/api/v1/api-keys/", {"name": "k", "scope": "manage", "user": "root"}),
            forbidden=new_key_of_another,
        ),
    ],
    "api:ApiKeyViewSet.partial_update": [
        walk(
            *KEY,
            go=api(
                "patch",
                lambda w: f"/api/v1/api-keys/{w.root_key.prefix}/",
                {"requests_per_minute": 1},
            ),
        )
    ],
    **{
        f"api:ApiKeyViewSet.{a}": [
            walk(
                *KEY,
                name="own",
                prepare=own_key,
                go=api("post", lambda w, a=a: f"/api/v1/api-keys/{w.prepared.prefix}/{a}/", {}),
            ),
            walk(
                *KEY,
                OTHERS_API_KEYS,
                name="another's",
                go=api("post", lambda w, a=a: f"/api/v1/api-keys/{w.root_key.prefix}/{a}/", {}),
            ),
        ]
        for a in ("rotate", "revoke")
    },
    **{
        f"api:WeightsViewSet.{a}": [
            walk(
                "fleet.change_localweights",
                prepare=(
                    lambda w, u: LocalWeights.objects.filter(pk=w.weights.pk).update(pinned=True)
                )
                if a == "unpin"
                else None,
                go=api("post", lambda w, a=a: f"/api/v1/weights/{w.weights.pk}/{a}/"),
            )
        ]
        for a in ("pin", "unpin", "remove")
    },
    "api:WeightsViewSet.cleanup_run": [
        walk("fleet.change_localweights", go=api("post", "/api/v1/weights/cleanup/"))
    ],
    # ---- other URLs ----------------------------------------------------------------------
    # ---- GPU faults and a node's notice (docs/operations.md) -------------------------------
    "api:GPUViewSet.clear": [
        walk(
            "fleet.drain_node",
            prepare=faulty_gpu,
            go=api("post", lambda w: f"/api/v1/gpus/{w.prepared.pk}/clear/", {"reason": "reset"}),
        )
    ],
    "api:NodeViewSet.notice": [
        walk(
            "fleet.drain_node",
            go=api("post", lambda w: f"/api/v1/nodes/{w.node.pk}/notice/", {"in_s": 120}),
        )
    ],
    "url:console:gpu-clear": [
        walk(
            "fleet.drain_node",
            prepare=faulty_gpu,
            go=gpu_clear_form(
                lambda w: f"/admin/cluster/nodes/{w.node.pk}/gpus/{w.prepared.index}/clear/"
            ),
        )
    ],
    "admin:fleet.gpu:action:clear_faults": [
        walk(
            "fleet.drain_node",
            prepare=faulty_gpu,
            go=lambda w, user: client_of(user).post(
                reverse("admin:fleet_gpu_changelist"),
                {
                    "action": "clear_faults",
                    "_selected_action": [str(w.prepared.pk)],
                    "index": "0",
                    "reason": "reset",
                },
            ),  # fmt: skip
        )
    ],
    "admin:fleet.node:action:give_notice": [
        walk(
            "fleet.drain_node",
            go=lambda w, user: client_of(user).post(
                reverse("admin:fleet_node_changelist"),
                {
                    "action": "give_notice",
                    "_selected_action": [w.node.pk],
                    "apply": "yes",
                    "notice_in": "2m",
                    "reason": "spot reclaim",
                },
            ),  # fmt: skip
        )
    ],
    "command:gpu": [
        walk(
            "fleet.drain_node",
            prepare=faulty_gpu,
            go=command(
                "gpu", "clear", lambda w: f"{w.node.pk}/{w.prepared.index}", "--reason", "reset"
            ),
        )
    ],
    "command:notice": [
        walk(
            "fleet.drain_node",
            go=command("notice", lambda w: w.node.pk, "--in", "2m", "--no-input"),
        )
    ],
    "url:console:node-action": [
        walk(
            P + perm,
            name=action,
            prepare=NODE_ACTION_PREPARE.get(action),
            go=api("post", lambda w, action=action: f"/admin/cluster/nodes/{w.node.pk}/{action}/"),
        )
        for action, (perm, *_) in node_actions.ACTIONS.items()
        for perm in [perm.removeprefix(P)]
    ],
    **{
        f"url:console:{name}": NoChange(
            api("post", (lambda w, path=path: path(w))), "a page: GET only"
        )
        for name, path in (
            ("cluster", lambda w: "/admin/cluster/"),
            ("cluster-fragment", lambda w: "/admin/cluster/fragment/"),
            ("node", lambda w: f"/admin/cluster/nodes/{w.node.pk}/"),
            ("node-fragment", lambda w: f"/admin/cluster/nodes/{w.node.pk}/fragment/"),
            ("node-charts", lambda w: f"/admin/cluster/nodes/{w.node.pk}/charts/"),
            ("node-logs", lambda w: f"/admin/cluster/nodes/{w.node.pk}/logs/"),
            ("model", lambda w: f"/admin/cluster/models/{w.model.pk}/"),
            ("model-fragment", lambda w: f"/admin/cluster/models/{w.model.pk}/fragment/"),
            ("batches", lambda w: "/admin/cluster/batches/"),
            ("batches-fragment", lambda w: "/admin/cluster/batches/fragment/"),
            ("batch", lambda w: "/admin/cluster/batches/batch_none/"),
            ("batch-fragment", lambda w: "/admin/cluster/batches/batch_none/fragment/"),
            ("costs", lambda w: "/admin/cluster/costs/"),
        )
    },
    "url:admin:index": NoChange(api("post", "/admin/"), "a page"),
    "url:admin:app_list": NoChange(api("post", "/admin/fleet/"), "a page"),
    "url:admin:jsi18n": NoChange(api("post", "/admin/jsi18n/"), "a script"),
    "url:admin:autocomplete": NoChange(api("post", "/admin/autocomplete/"), "a search"),
    "url:admin:view_on_site": NoChange(
        api("post", lambda w: f"/admin/r/1/{w.node.pk}/"), "a redirect"
    ),
    "url:admin:(?P<url>.*)$": NoChange(api("post", "/admin/no/such/page/"), "the catch-all"),
    "url::": NoChange(api("post", "/"), "a redirect to the console"),
    "url::favicon.ico": NoChange(api("post", "/favicon.ico"), "a redirect"),
    # The Batch API answers inference API keys only (tests/batches holds its owners' walks):
    # a user's session, whatever its permissions, is a 401 there and writes nothing.
    **{
        f"url::{route}": NoChange(api("post", path), "the Batch API: an inference key's door")
        for route, path in (
            ("files", "/v1/files"),
            ("files/<str:file_id>", "/v1/files/file-x"),
            ("files/<str:file_id>/content", "/v1/files/file-x/content"),
            ("batches", "/v1/batches"),
            ("batches/<str:batch_id>", "/v1/batches/batch_x"),
            ("batches/<str:batch_id>/cancel", "/v1/batches/batch_x/cancel"),
            ("^(?P<rest>(?:files|batches)(?:/.*)?)$", "/v1/files/x/y/z"),
        )
    },
    "url:admin:login": NotADoor("logging in: the login throttle's tests (tests/admin)"),
    "url:admin:logout": NotADoor("logging out ends one's own session"),
    "url:admin:password_change": NotADoor("one's own password, with the old one"),
    "url:admin:password_change_done": NoChange(
        api("post", "/admin/password_change/done/"), "a page"
    ),
    "url:admin:auth_user_password_change": [
        walk(
            "auth.change_user",
            go=lambda w, user: client_of(user).post(
                reverse("admin:auth_user_password_change", args=[w.bystander.pk]),
                {
                    "password1": "n3w-Passw0rd!x",
                    "password2": "n3w-Passw0rd!x",
                    "usable_password": "true",
                },
            ),
        )
    ],
    # ---- the admin --------------------------------------------------------------------------
    "admin:fleet.jointoken:add": [
        walk(
            "fleet.add_jointoken",
            go=admin_form(
                "add", "fleet.jointoken", {"name": "t", "lifetime": "1h", "max_uses": "1"}
            ),
        )
    ],
    "admin:fleet.jointoken:change": [
        walk(
            "fleet.change_jointoken",
            go=admin_form("change", "fleet.jointoken", {"name": "renamed"}, lambda w: w.token),
        )
    ],
    "admin:fleet.jointoken:delete": [
        walk("fleet.delete_jointoken", go=admin_delete("fleet.jointoken", lambda w: w.token))
    ],
    "admin:fleet.jointoken:action:delete_selected": [
        walk(
            "fleet.delete_jointoken",
            go=admin_action("fleet.jointoken", "delete_selected", lambda w: [w.token]),
        )
    ],
    "admin:fleet.jointoken:action:revoke_tokens": [
        walk(
            "fleet.change_jointoken",
            go=admin_action("fleet.jointoken", "revoke_tokens", lambda w: [w.token]),
        )
    ],
    "admin:fleet.apikey:add": [
        walk(
            "fleet.add_apikey",
            go=admin_form("add", "fleet.apikey", {"name": "k", "scope": "inference"}),
        ),
        walk(
            "fleet.add_apikey",
            OTHERS_API_KEYS,
            name="for another",
            go=admin_form(
                "add",
                "fleet.apikey",
                lambda w: {"name": "k", "scope": "manage", "user": str(w.root.pk)},
            ),
            forbidden=new_key_of_another,
        ),
    ],
    "admin:fleet.apikey:change": [
        walk(
            *KEY, go=admin_form("change", "fleet.apikey", {"name": "renamed"}, lambda w: w.root_key)
        )
    ],
    "admin:fleet.apikey:delete": [
        walk(
            "fleet.delete_apikey",
            name="own",
            prepare=own_key,
            go=admin_delete("fleet.apikey", lambda w: w.prepared),
        ),
        walk(
            "fleet.delete_apikey",
            OTHERS_API_KEYS,
            name="another's",
            go=admin_delete("fleet.apikey", lambda w: w.root_key),
        ),
    ],
    "admin:fleet.apikey:action:delete_selected": [
        walk(
            "fleet.delete_apikey",
            OTHERS_API_KEYS,
            go=admin_action("fleet.apikey", "delete_selected", lambda w: [w.root_key]),
        )
    ],
    "admin:fleet.apikey:action:revoke_keys": [
        walk(
            *KEY,
            name="own",
            prepare=own_key,
            go=admin_action("fleet.apikey", "revoke_keys", lambda w: [w.prepared]),
        ),
        walk(
            *KEY,
            OTHERS_API_KEYS,
            name="another's",
            go=admin_action("fleet.apikey", "revoke_keys", lambda w: [w.root_key]),
        ),
    ],
    "admin:fleet.team:add": [
        walk(
            "fleet.add_team",
            go=admin_form("add", "fleet.team", lambda w: {"name": "t", "group": str(w.group.pk)}),
        )
    ],
    "admin:fleet.team:change": [
        walk(
            "fleet.change_team",
            go=admin_form(
                "change",
                "fleet.team",
                lambda w: {"name": "research", "group": str(w.team.group_id), "max_gpus": "8"},
                lambda w: w.team,
            ),
        ),
        walk(
            "fleet.change_team",
            name="budget",
            go=admin_form(
                "change",
                "fleet.team",
                lambda w: {"budget_per_month": "1000", "budget_currency": "EUR"},
                lambda w: w.team,
            ),
        ),
    ],
    # The change and delete views of a price are nobody's (test_doors_nobody_may_use).
    "admin:fleet.price:add": [
        walk(
            "fleet.add_price",
            go=admin_form(
                "add",
                "fleet.price",
                {
                    "gpu_class": "H100",
                    "per_hour": "2.50",
                    "currency": "EUR",
                    "effective_from_0": "2026-11-01",
                    "effective_from_1": "00:00:00",
                },
            ),
        )
    ],
    "admin:fleet.team:delete": NoChange(
        admin_delete("fleet.team", lambda w: w.team),
        "a team that owns models is kept: delete or move them first",
    ),
    "admin:fleet.team:action:delete_selected": NoChange(
        admin_action("fleet.team", "delete_selected", lambda w: [w.team]),
        "a team that owns models is kept: delete or move them first",
    ),
    "admin:fleet.model:add": [
        walk(
            "fleet.add_model",
            go=admin_form("add", "fleet.model", {"name": "fresh", "desired_replicas": "1"}),
        )
    ],
    "admin:fleet.model:change": [
        walk(
            "fleet.change_model",
            go=admin_form("change", "fleet.model", {"description": "changed"}, lambda w: w.spare),
        )
    ],
    "admin:fleet.model:delete": [
        walk(
            "fleet.delete_model",
            "fleet.delete_engineprofile",
            "fleet.delete_adapter",  # its adapters go with it
            go=admin_delete("fleet.model", lambda w: w.spare),
        )
    ],
    "admin:fleet.model:action:delete_selected": [
        walk(
            "fleet.delete_model",
            "fleet.delete_engineprofile",
            "fleet.delete_adapter",  # its adapters go with it
            go=admin_action("fleet.model", "delete_selected", lambda w: [w.spare]),
        )
    ],
    "admin:fleet.engineprofile:add": [
        walk(
            "fleet.add_engineprofile",
            go=admin_form(
                "add",
                "fleet.engineprofile",
                lambda w: {
                    "model": str(w.spare.pk),
                    "name": "p2",
                    "engine": "llamacpp",
                    "model_path": "/m/x.gguf",
                    "gpus_per_node": "0",
                },
            ),
        ),
        walk(
            "fleet.add_engineprofile",
            ARGS_ENV,
            name="with env",
            go=admin_form(
                "add",
                "fleet.engineprofile",
                lambda w: {
                    "model": str(w.spare.pk),
                    "name": "p3",
                    "engine": "llamacpp",
                    "model_path": "/m/x.gguf",
                    "gpus_per_node": "0",
                    "env": '{"LD_PRELOAD": "/tmp/x.so"}',
                },
            ),
            forbidden=lambda diff, user: any(
                row["env"] for row in diff.added.get("fleet.engineprofile", {}).values()
            ),
        ),
    ],
    "admin:fleet.engineprofile:change": [
        walk(
            "fleet.change_engineprofile",
            go=admin_form(
                "change",
                "fleet.engineprofile",
                {"node_selector": "zone=b"},
                lambda w: w.spare_profile,
            ),
        ),
        walk(
            "fleet.change_engineprofile",
            ARGS_ENV,
            name="args",
            go=admin_form(
                "change", "fleet.engineprofile", {"args": '["--x"]'}, lambda w: w.spare_profile
            ),
            forbidden=profile_args_changed,
        ),
    ],
    "admin:fleet.engineprofile:delete": [
        walk(
            "fleet.delete_engineprofile",
            go=admin_delete("fleet.engineprofile", lambda w: w.spare_profile),
        )
    ],
    "admin:fleet.engineprofile:action:delete_selected": [
        walk(
            "fleet.delete_engineprofile",
            go=admin_action("fleet.engineprofile", "delete_selected", lambda w: [w.spare_profile]),
        )
    ],
    "admin:fleet.adapter:add": [
        walk(
            "fleet.add_adapter",
            go=admin_form(
                "add",
                "fleet.adapter",
                lambda w: {"name": "spare-poet", "model": str(w.spare.pk), "source": "/m/p.gguf"},
            ),
        )
    ],
    "admin:fleet.adapter:change": [
        walk(
            "fleet.change_adapter",
            go=admin_form(
                "change", "fleet.adapter", {"source": "/m/sql2.gguf"}, lambda w: w.adapter
            ),
        )
    ],
    "admin:fleet.adapter:delete": [
        walk("fleet.delete_adapter", go=admin_delete("fleet.adapter", lambda w: w.adapter))
    ],
    "admin:fleet.adapter:action:delete_selected": [
        walk(
            "fleet.delete_adapter",
            go=admin_action("fleet.adapter", "delete_selected", lambda w: [w.adapter]),
        )
    ],
    "admin:fleet.node:change": [
        walk(
            "fleet.change_node",
            go=admin_form(
                "change", "fleet.node", {"operator_labels": '{"zone": "b"}'}, lambda w: w.node
            ),
        ),
        walk(
            "fleet.change_node",
            "fleet.drain_node",
            name="cordon",
            go=admin_form("change", "fleet.node", {"cordoned": "on"}, lambda w: w.node),
            forbidden=node_cordon_changed,
        ),
    ],
    "admin:fleet.node:delete": [
        walk("fleet.delete_node", go=admin_delete("fleet.node", lambda w: w.bare_node))
    ],
    "admin:fleet.node:action:delete_selected": [
        walk(
            "fleet.delete_node",
            go=admin_action("fleet.node", "delete_selected", lambda w: [w.bare_node]),
        )
    ],
    **{
        f"admin:fleet.node:action:{a}": [
            walk(P + perm, go=admin_action("fleet.node", a, lambda w: [w.node]))
        ]
        for a, perm in (
            ("cordon_nodes", "drain_node"),
            ("drain_nodes", "drain_node"),
            ("revoke_credentials", "change_node"),
            ("vllm_build_cu13", "change_node"),
            ("vllm_build_cu129", "change_node"),
            ("vllm_build_cpu", "change_node"),
            ("vllm_build_none", "change_node"),
        )
    },
    "admin:fleet.node:action:uncordon_nodes": [
        walk(
            "fleet.drain_node",
            prepare=lambda w, u: Node.objects.filter(pk=w.node.pk).update(cordoned=True),
            go=admin_action("fleet.node", "uncordon_nodes", lambda w: [w.node]),
        )
    ],
    "admin:fleet.node:action:vllm_build_auto": [
        walk(
            "fleet.change_node",
            prepare=lambda w, u: Node.objects.filter(pk=w.node.pk).update(vllm_build="none"),
            go=admin_action("fleet.node", "vllm_build_auto", lambda w: [w.node]),
        )
    ],
    **{
        f"admin:fleet.localweights:action:{a}": [
            walk(
                "fleet.change_localweights",
                prepare=(
                    lambda w, u: LocalWeights.objects.filter(pk=w.weights.pk).update(pinned=True)
                )
                if a == "unpin"
                else None,
                go=admin_action("fleet.localweights", a, lambda w: [w.weights]),
            )
        ]
        for a in ("pin", "unpin", "remove_now")
    },
    "admin:fleet.wantedengine:add": [
        walk(
            "fleet.add_wantedengine",
            go=admin_form("add", "fleet.wantedengine", {"engine": "sglang", "version": "0.5.0"}),
        )
    ],
    "admin:fleet.wantedengine:change": [
        walk(
            "fleet.change_wantedengine",
            go=admin_form(
                "change", "fleet.wantedengine", {"version": "0.12.0"}, lambda w: w.engine
            ),
        )
    ],
    "admin:fleet.wantedengine:delete": [
        walk("fleet.delete_wantedengine", go=admin_delete("fleet.wantedengine", lambda w: w.engine))
    ],
    "admin:fleet.wantedengine:action:delete_selected": [
        walk(
            "fleet.delete_wantedengine",
            go=admin_action("fleet.wantedengine", "delete_selected", lambda w: [w.engine]),
        )
    ],
    "admin:fleet.event:delete": [
        walk("fleet.delete_event", go=admin_delete("fleet.event", lambda w: w.event))
    ],
    "admin:fleet.event:action:delete_selected": [
        walk(
            "fleet.delete_event",
            go=admin_action("fleet.event", "delete_selected", lambda w: [w.event]),
        )
    ],
    "admin:auth.user:add": [
        walk(
            "auth.add_user",
            "auth.change_user",  # Django's UserAdmin asks both: a new user's next page edits it
            go=admin_form(
                "add",
                "auth.user",
                {
                    "username": "fresh",
                    "password1": "n3w-Passw0rd!x",
                    "password2": "n3w-Passw0rd!x",
                    "usable_password": "true",
                },
            ),
        )
    ],
    "admin:auth.user:change": [
        walk(
            "auth.change_user",
            go=admin_form("change", "auth.user", {"first_name": "Changed"}, lambda w: w.bystander),
        )
    ],
    "admin:auth.user:delete": [
        walk("auth.delete_user", go=admin_delete("auth.user", lambda w: w.bystander))
    ],
    "admin:auth.user:action:delete_selected": [
        walk(
            "auth.delete_user",
            go=admin_action("auth.user", "delete_selected", lambda w: [w.bystander]),
        )
    ],
    "admin:auth.group:add": [
        walk("auth.add_group", go=admin_form("add", "auth.group", {"name": "fresh"}))
    ],
    "admin:auth.group:change": [
        walk(
            "auth.change_group",
            go=admin_form("change", "auth.group", {"name": "renamed"}, lambda w: w.group),
        )
    ],
    "admin:auth.group:delete": [
        walk("auth.delete_group", go=admin_delete("auth.group", lambda w: w.group))
    ],
    "admin:auth.group:action:delete_selected": [
        walk(
            "auth.delete_group",
            go=admin_action("auth.group", "delete_selected", lambda w: [w.group]),
        )
    ],
    "admin:axes.accessattempt:delete": [
        walk(
            "axes.delete_accessattempt",
            prepare=expired_attempt,
            go=admin_delete("axes.accessattempt", lambda w: w.prepared),
        )
    ],
    "admin:axes.accessattempt:action:delete_selected": [
        walk(
            "axes.delete_accessattempt",
            prepare=expired_attempt,
            go=admin_action("axes.accessattempt", "delete_selected", lambda w: [w.prepared]),
        )
    ],
    "admin:axes.accessattempt:action:cleanup_expired_attempts": [
        walk(
            "axes.delete_accessattempt",
            prepare=expired_attempt,
            go=admin_action(
                "axes.accessattempt", "cleanup_expired_attempts", lambda w: [w.prepared]
            ),
        )
    ],
    **{
        f"admin:axes.{name}:change": NoChange(
            admin_form("change", f"axes.{name}", {"username": "changed"}, lambda w: w.prepared),
            "axes's records: every field read-only",
            prepare=make,
        )
        for name, make in (
            ("accessattempt", lambda w, u: expired_attempt(w, u)),
            (
                "accesslog",
                lambda w, u: AccessLog.objects.create(username="x", ip_address="10.0.0.9"),
            ),
            (
                "accessfailurelog",
                lambda w, u: AccessFailureLog.objects.create(username="x", ip_address="10.0.0.9"),
            ),
        )
    },
    **{
        door: [
            walk(
                f"axes.delete_{name}",
                prepare=lambda w, u, cls=cls: cls.objects.create(
                    username="x", ip_address="10.0.0.9"
                ),
                go=(
                    admin_delete(f"axes.{name}", lambda w: w.prepared)
                    if door.endswith(":delete")
                    else admin_action(f"axes.{name}", "delete_selected", lambda w: [w.prepared])
                ),
            )
        ]
        for name, cls in (("accesslog", AccessLog), ("accessfailurelog", AccessFailureLog))
        for door in (f"admin:axes.{name}:delete", f"admin:axes.{name}:action:delete_selected")
    },
    # ---- management commands: --as USER; without it, the system ---------------------------
    "command:apply": [
        walk(*needs, name=n, go=write_catalog(text)) for n, (needs, text) in APPLY_WALKS.items()
    ],
    "command:cordon": [walk("fleet.drain_node", go=command("cordon", lambda w: w.node.pk))],
    "command:replica": [
        walk("fleet.drain_replica", name=a, go=command("replica", a, lambda w: w.replica.pk))
        for a in ("drain", "stop", "restart")
    ],
    "command:drain": [
        walk("fleet.drain_node", go=command("drain", lambda w: w.node.pk, "--no-input"))
    ],
    "command:uncordon": [
        walk(
            "fleet.drain_node",
            prepare=lambda w, u: Node.objects.filter(pk=w.node.pk).update(cordoned=True),
            go=command("uncordon", lambda w: w.node.pk),
        )
    ],
    "command:revoke_node": [
        walk("fleet.change_node", go=command("revoke_node", lambda w: w.node.pk, "--no-input"))
    ],
    "command:engine_build": [
        walk("fleet.change_node", go=command("engine_build", lambda w: w.node.pk, "cu13"))
    ],
    "command:gc_weights": [
        walk("fleet.change_localweights", go=command("gc_weights", "--wait", "0"))
    ],
    "command:create_join_token": [
        walk("fleet.add_jointoken", go=command("create_join_token", "t"))
    ],
    "command:create_api_key": [
        walk("fleet.add_apikey", go=command("create_api_key", "k")),
        walk(
            "fleet.add_apikey",
            OTHERS_API_KEYS,
            name="for another",
            go=command("create_api_key", "k", "--scope", "manage", "--user", "root"),
            forbidden=new_key_of_another,
        ),
    ],
    "command:rotate_api_key": [
        walk(
            *KEY,
            name="own",
            prepare=own_key,
            go=command("rotate_api_key", lambda w: w.prepared.prefix),
        ),
        walk(
            *KEY,
            OTHERS_API_KEYS,
            name="another's",
            go=command("rotate_api_key", lambda w: w.root_key.prefix),
        ),
    ],
    **{
        f"command:{name}": NoChange(
            lambda w, user, args=args, name=name: command(name, *args)(w, None), "reads only"
        )
        for name, args in (
            ("nodes", ()),
            ("usage", ()),
            ("weights", ()),
            ("explain", ("fresh", "--file", "__catalog__")),
        )
    },
}


def _explain_file(w):
    with open(w.catalog_file, "w", encoding="utf-8") as fh:
        fh.write(catalog_text())
    return w.catalog_file


EXPECTED["command:explain"] = NoChange(
    lambda w, user: command("explain", "fresh", "--file", _explain_file)(w, None),
    "a what-if: the file is applied in a transaction rolled back",
)


# ---- snapshots ---------------------------------------------------------------------------------


@dataclass
class Diff:
    added: dict[str, dict] = field(default_factory=dict)
    removed: dict[str, dict] = field(default_factory=dict)
    changed: dict[str, dict] = field(default_factory=dict)  # label -> pk -> (before, after)

    def __bool__(self) -> bool:
        return bool(self.added or self.removed or self.changed)

    def changed_columns(self, label: str) -> list[set]:
        return [
            {k for k in before if before[k] != after[k]}
            for before, after in self.changed.get(label, {}).values()
        ]

    def __str__(self) -> str:
        lines = [f"+ {label} {pk}" for label, rows in self.added.items() for pk in rows]
        lines += [f"- {label} {pk}" for label, rows in self.removed.items() for pk in rows]
        lines += [
            f"~ {label} {pk}: " + ", ".join(sorted(k for k in b if b[k] != a[k]))
            for label, rows in self.changed.items()
            for pk, (b, a) in rows.items()
        ]
        return "; ".join(lines)


def _columns(model) -> list[str]:
    return [
        f.attname
        for f in model._meta.concrete_fields
        if not getattr(f, "auto_now", False) and f.name not in NOISE_FIELDS
    ]


def rows_written() -> dict[str, int] | int:
    """Rows this transaction has written so far: by table on PostgreSQL (its
    ``pg_stat_xact_user_tables``), in all on SQLite (its ``total_changes``)."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT relname, n_tup_ins + n_tup_upd + n_tup_del FROM pg_stat_xact_user_tables"
            )
            return dict(cursor.fetchall())
    return connection.connection.total_changes


def tables_written(since: dict[str, int] | int) -> set[str] | None:
    """The tables written to since ``since`` (``rows_written``); None: any may have been,
    as where the database names a table no model's ``db_table`` spells (read them all)."""
    now = rows_written()
    if isinstance(since, int):
        return set() if now == since else None
    written = {table for table, n in now.items() if n != since.get(table, 0)}
    known = {m._meta.db_table for m in apps.get_models(include_auto_created=True)}
    return written if written <= known else None


def snapshot(tables: set[str] | None = None) -> dict[str, dict]:
    """Every row of every table (of ``tables`` only, where given), by model and pk."""
    rows = {}
    for model in apps.get_models(include_auto_created=True):
        label = model._meta.label_lower
        if label in NOISE_MODELS or model._meta.proxy:
            continue
        if tables is not None and model._meta.db_table not in tables:
            continue
        rows[label] = {r["pk"]: r for r in model.objects.values("pk", *_columns(model))}
    return rows


def diff(before: dict, after: dict) -> Diff:
    d = Diff()
    for label in before:
        b, a = before[label], after[label]
        if added := {pk: a[pk] for pk in a.keys() - b.keys()}:
            d.added[label] = added
        if removed := {pk: b[pk] for pk in b.keys() - a.keys()}:
            d.removed[label] = removed
        if changed := {pk: (b[pk], a[pk]) for pk in a.keys() & b.keys() if a[pk] != b[pk]}:
            d.changed[label] = changed
    return d


# ---- walkers ------------------------------------------------------------------------------------


class Walkers:
    """Staff users with the views and some permissions, made as a walk needs them."""

    def __init__(self):
        self.perms = {
            f"{p.content_type.app_label}.{p.codename}": p
            for p in Permission.objects.select_related("content_type")
        }
        self.views = {n for n in self.perms if n.split(".")[1].startswith("view_")}
        self.seq = itertools.count()

    def make(self, names) -> object:
        User = get_user_model()
        # Made before the walk's snapshot, so its audit rows are no part of what the walk
        # shows; unrecorded, since recording a user's hundreds of permissions names each
        # (a query apiece) and cost a third of this module's time.
        with disable_auditlog():
            user = User.objects.create_user(f"walker{next(self.seq)}", is_staff=True)
            user.user_permissions.set([self.perms[n] for n in names])
        return User.objects.get(pk=user.pk)  # fresh: permissions are cached on the object

    def view_only(self):
        return self.make(self.views)

    def all_but(self, perm):
        return self.make(set(self.perms) - {perm})

    def exactly(self, needs):
        return self.make(self.views | set(needs))

    def everything(self):
        return self.make(self.perms)


def changed_by(walk: Callable[[], object]) -> Diff:
    """What ``walk()`` changed, in a savepoint of its own rolled back after.

    The rows are read after the walk, then again once its savepoint is rolled back
    (as they were before it), in the tables it wrote to: every table where the
    database cannot say which (SQLite), none where it wrote nothing.
    """
    since = rows_written()
    with transaction.atomic():
        walk()
        tables = tables_written(since)
        after = snapshot(tables)
        transaction.set_rollback(True)
    return diff(snapshot(tables), after)


def run(w: World, go, user, prepare=None) -> Diff:
    """``go`` as ``user`` in a savepoint rolled back after; what it changed in between."""
    with transaction.atomic():
        # Sessions die with the savepoint (and a rolled-back user's pk comes back for the
        # next walker): log in afresh, before the walk, as logins write.
        _CLIENTS.clear()
        client_of(w.root), client_of(user)
        w.prepared = prepare(w, user) if prepare else None
        changed = changed_by(lambda: go(w, user))
        transaction.set_rollback(True)
    return changed


def found_doors(superuser) -> set[str]:
    return url_doors() | admin_doors(superuser) | command_doors()


# ---- the tests ----------------------------------------------------------------------------------


def _door_ids():
    """Every door known to EXPECTED and every admin door: the parameters of the walk."""
    return sorted(EXPECTED)


def test_every_write_door_has_an_expectation(world):
    """A door added later without an entry here fails: unknown is not allowed."""
    found = found_doors(world.root)
    request = _superuser_request(world.root)
    # An admin view nobody may use (add, on a page of observed facts) needs no entry;
    # test_doors_nobody_may_use walks it as a user with every permission.
    found -= set(nobodys_admin_doors(request))
    unknown = sorted(found - set(EXPECTED))
    stale = sorted(set(EXPECTED) - found)
    assert not unknown, f"write doors with no entry in EXPECTED: {unknown}"
    assert not stale, f"entries in EXPECTED for doors that no longer exist: {stale}"


def nobodys_admin_doors(request) -> dict[str, Callable]:
    """The admin's views a superuser is refused, with a walk that tries them anyway."""
    doors = {}
    for model, model_admin in registered_admins():
        label = model._meta.label_lower
        app, name = label.split(".")
        if not model_admin.has_add_permission(request):
            doors[f"admin:{label}:add"] = (
                lambda w, user, app=app, name=name: client_of(user).post(
                    reverse(f"admin:{app}_{name}_add"), {}
                ),
                model,
            )
        for view, allowed in (
            ("change", model_admin.has_change_permission(request)),
            ("delete", model_admin.has_delete_permission(request)),
        ):
            if not allowed:
                doors[f"admin:{label}:{view}"] = (
                    lambda w, user, app=app, name=name, view=view, model=model: _post_to_first(
                        w, user, app, name, view, model
                    ),
                    model,
                )
    return {k: go for k, (go, _) in doors.items()}


def _post_to_first(w, user, app, name, view, model):
    row = model.objects.first()
    if row is None:
        return None
    data = {"post": "yes"} if view == "delete" else {}
    return client_of(user).post(reverse(f"admin:{app}_{name}_{view}", args=[row.pk]), data)


@pytest.mark.parametrize("door", _door_ids())
def test_door(world, door):
    expected = EXPECTED[door]
    walkers = Walkers()
    if isinstance(expected, NotADoor):
        return  # said why in EXPECTED; nothing to walk
    if isinstance(expected, NoChange):
        changed = run(world, expected.go, walkers.everything(), expected.prepare)
        assert not changed, f"{door} ({expected.why}) changed: {changed}"
        return
    breaches = []
    for w in expected:
        label = f"{door}{' (' + w.name + ')' if w.name else ''}"
        forbidden = w.forbidden or (lambda d, u: bool(d))
        tries = [("view permissions only", walkers.view_only())]
        tries += [(f"every permission but {p}", walkers.all_but(p)) for p in sorted(w.needs)]
        for who, user in tries:
            d = run(world, w.go, user, w.prepare)
            if forbidden(d, user):
                breaches.append(f"{label}: a user with {who} made a change: {d}")
        user = walkers.exactly(w.needs)
        d = run(world, w.go, user, w.prepare)
        if not forbidden(d, user):
            breaches.append(
                f"{label}: a user with {sorted(w.needs)} made no change ({d or 'nothing'}): "
                "the walk proves nothing"
            )
    assert not breaches, "\n".join(breaches)


def test_doors_nobody_may_use(world):
    """Pages of observed facts: not even a user with every permission changes a row."""
    doors = nobodys_admin_doors(_superuser_request(world.root))
    user = Walkers().everything()
    changed = {door: d for door, go in doors.items() if (d := run(world, go, user))}
    assert not changed, {door: str(d) for door, d in changed.items()}
