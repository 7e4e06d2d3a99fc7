"""The walks of tests/security/test_reference_walk.py: for each field that names another
object or claims capacity, each door that writes it, and what a refusal there says.

``go(w, user, target)`` makes the change through a door as ``user``; ``target`` is
"theirs" (team vision's object, or past research's bound) or "own" (research's, the
fleet's, within the bound); it returns what the door said: the status and a refusal's
text (a JSON body's strings, an admin form's errors, a command's error).
"""

from __future__ import annotations

import html
import io
import json
import re
from collections.abc import Callable
from dataclasses import dataclass

from django.core.management import call_command
from django.core.management.base import CommandError
from django.urls import reverse

from fleet.models import EngineProfile, Team

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


CATALOG_DOORS = ("api:CatalogViewSet.apply", "command:apply")


def catalog(text) -> dict[str, Callable]:
    """The two doors a catalog file goes through: the API and ``manage.py apply -f``."""

    def through_command(w, user, t):
        with open(w.catalog_file, "w", encoding="utf-8") as fh:
            fh.write(text(w, t))
        return command("apply", "-f", w.catalog_file)(w, user, t)

    through_api = api("post", "/api/v1/catalog/apply/", lambda w, t: {"catalog": text(w, t)})
    return dict(zip(CATALOG_DOORS, (through_api, through_command), strict=True))


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
MOVED = "the move itself is walked as the model's team; here only its priority is judged"


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
        walks=[
            *model_walks("priority", pick(50, 10), says=BOUND),
            # llama-small's priority 10 is research's maximum; labs' is 0.
            door(
                "api:ModelViewSet.partial_update",
                api("patch", models_url(lambda w: w.small), lambda w, t: {"team": "labs"}),
                "fleet.change_model",
                says=("team 'labs'", "0"),
                name="moved to a team of a lower maximum",
                own=False,
                why=MOVED,
            ),
            *catalog_walks(
                lambda w, t: entry("llama-small", priority=10, team="labs"),
                "fleet.change_model",
                says=("team 'labs'", "0"),
                name="moved to a team of a lower maximum",
                own=False,
                why=MOVED,
            ),
        ],
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
