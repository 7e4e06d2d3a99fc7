"""``apply -f catalog.yaml``: models and their engine profiles, declared in a file.

The file is the truth for what it names: a field left out takes its default.
Models and profiles it does not name are left alone. The whole file applies or
nothing does, and every problem is reported at once with the field it is in,
using the same ``clean()`` rules as the admin and the API; what it may say is
checked first, for shape (``catalog_file``). The file is at most
1 MiB and 100,000 values, and has no anchors or aliases (``&x``/``*x``: refused,
see agentd.safeyaml)::

    models:
      - name: qwen2.5-7b
        replicas: 2
        placement_policy: spread      # or binpack (default)
        prefix_routing: true          # optional; default false (docs/gateway.md)
        private: true                 # optional: only its team's keys call it
        replace_after_s: 120          # optional; default: the fleet's
        min_replicas: 0               # optional, with max_replicas: autoscaling
        max_replicas: 4               # (replicas is then its starting point,
        scale_to_zero_after_s: 600    # kept on a re-apply that leaves it out)
        sleep_after_s: 300            # optional: idle 5 minutes, its replicas sleep (GPU
        sleep_level: 1                # memory given back, weights kept in host memory;
        stop_after_asleep_s: 3600     # a request wakes them), and stop after an hour
        profile: h100                 # the active profile
        profiles:
          - name: h100
            engine: vllm
            model_path: Qwen/Qwen2.5-7B-Instruct   # or https://…/file, hf://org/name[@rev]
            gpus_per_node: 1
            gpu_class: H100
            # weights_sha256: {model.gguf: 3a7b…}   # optional, for fetched weights
            max_adapters: 4           # optional: LoRA adapters each replica holds
        adapters:                     # optional: LoRA adapters, asked for by name
          - name: qwen2.5-7b-sql
            source: hf://acme/qwen-sql-lora   # a path, https://…/file or hf://…
            rank: 16                  # optional

    engines:                          # optional: the engines every node installs
      vllm: 0.11.2                    # (docs/engines.md); engines not named are left
      llamacpp: 0.3.36                # alone

    prices:                           # optional: an hour of a GPU class, from a date
      - gpu_class: H100               # (fleet.services.catalog_prices)
        per_hour: 2.50
        effective_from: 2026-01-01
"""

import enum
import logging
from dataclasses import dataclass, field

from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from fleet.models import EngineProfile, Model, Team, WantedEngine

from . import catalog_file, catalog_prices, permissions, profiles, reach, teams
from .catalog_file import ADAPTER_KEYS, MODEL_KEYS, PROFILE_KEYS
from .permissions import SYSTEM

logger = logging.getLogger(__name__)


class CatalogError(Exception):
    """The file cannot be applied. ``errors`` lists every problem, each naming its field."""

    def __init__(self, errors: list[str]):
        super().__init__("\n".join(errors))
        self.errors = errors


@dataclass
class ApplyResult:
    changes: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    # Action (fleet.services.permissions) -> what in the file needs it.
    needs: dict[str, list[str]] = field(default_factory=dict, repr=False)
    # (team id or None, what in the file): changes that need that team's scope.
    scopes: list[tuple[int | None, str]] = field(default_factory=list, repr=False)
    # By model name, its (team id, fallbacks) before the file: what reach judges new.
    before: dict[str, tuple] = field(default_factory=dict, repr=False)

    def need(self, action: str, what: str) -> None:
        self.needs.setdefault(action, []).append(what)


def _refusal(actor, result: ApplyResult) -> str | None:
    """Why ``actor`` may not apply the file's changes, or None when it may: each missing
    permission with the first few things in the file that need it, else the first
    change outside the actor's team (fleet.services.teams)."""
    lines = []
    for action, whats in result.needs.items():
        for perm in permissions.missing(actor, permissions.needs(action)):
            shown = ", ".join(whats[:3]) + (f" and {len(whats) - 3} more" if len(whats) > 3 else "")
            lines.append(f"{perm} ({shown})")
    if lines:
        return (
            f"{permissions.name_of(actor)} may not apply this file; nothing applied. "
            f"It needs: {'; '.join(lines)}"
        )
    for team_id, what in result.scopes:
        if why := teams.problem(actor, team_id, f"change {what}"):
            return f"{why}; nothing applied"
    return None


def parse(text: str) -> list[dict]:
    """The model entries of a catalog file, or CatalogError saying what is malformed."""
    return _parse(text)["models"]


def _parse(text: str) -> dict:
    """The whole file, or CatalogError with every problem of its shape (``catalog_file``)."""
    data, errors = catalog_file.read(text)
    if errors:
        raise CatalogError(errors)
    return data


def _apply_adapter(model, values: dict, result) -> list[str]:
    from fleet.models import Adapter

    where = f"adapter {values['name']}"
    adapter = Adapter.objects.filter(name=values["name"]).first()
    created = adapter is None
    if not created and adapter.model_id != model.pk:
        return [f"{where}: belongs to model '{adapter.model.name}'; an adapter keeps its base"]
    adapter = adapter or Adapter(model=model, name=values["name"])
    defaults = _defaults(Adapter, ADAPTER_KEYS - {"name"})
    diffs = _assign(adapter, {k: v for k, v in values.items() if k != "name"}, defaults)
    if errors := _validate(adapter, where):
        return errors
    if created or diffs:
        adapter.save()
        result.need("adapter.add" if created else "adapter.change", where)
        result.changes.append(f"{where} created" if created else f"{where}: " + ", ".join(diffs))
    return []


def _messages(where: str, exc: ValidationError) -> list[str]:
    if hasattr(exc, "error_dict"):
        return [f"{where}.{f}: {m}" for f, msgs in exc.message_dict.items() for m in msgs]
    return [f"{where}: {m}" for m in exc.messages]


def _validate(obj, where: str, exclude=()) -> list[str]:
    # Field types first: clean() compares values and must not meet a string
    # where a number belongs.
    for check in (obj.clean_fields, obj.full_clean):
        try:
            check(exclude=list(exclude))
        except ValidationError as exc:
            return _messages(where, exc)
    return []


def _assign(obj, values: dict, defaults: dict) -> list[str]:
    """Set fields on ``obj``; returns "field old → new" for each that changed."""
    diffs = []
    for name, default in defaults.items():
        new = values.get(name, default)
        old = getattr(obj, name)
        if old != new:
            diffs.append(f"{name} {old!r} → {new!r}")
            setattr(obj, name, new)
    return diffs


def _defaults(model_cls, names) -> dict:
    # A choice's value, not its enum member: a change reads "sleep_level 2 → 1", not
    # "→ SleepLevel.KEEP_WEIGHTS".
    defaults = {n: model_cls._meta.get_field(n).get_default() for n in names}
    return {n: d.value if isinstance(d, enum.Enum) else d for n, d in defaults.items()}


def apply(text: str, *, dry_run: bool = False, actor=SYSTEM) -> ApplyResult:
    """Apply a catalog file as ``actor``; returns what changed. Raises CatalogError and
    changes nothing.

    Each change needs what the per-object API needs for it: add or change_model,
    add or change_engineprofile, set_engine_args_env for a profile's args or env
    (stamped with the actor as their author: no user for SYSTEM), add or
    change_wantedengine for an engine's version, price.set for a price. An actor
    missing any of them gets permissions.Refused naming each, and nothing is applied
    (a dry run too).
    """
    data = _parse(text)
    entries = data["models"]
    result = ApplyResult()
    errors: list[str] = []
    model_defaults = _defaults(Model, MODEL_KEYS.values())
    profile_defaults = _defaults(EngineProfile, PROFILE_KEYS - {"name"})
    author = {"actor": actor, "at": timezone.now()}
    with transaction.atomic():
        for entry in entries:
            errors += _apply_model(entry, model_defaults, profile_defaults, result, author)
        # Once every model of the file exists: the fallbacks they name must, and be
        # models the actor may send its overflow to (fleet.services.reach).
        beyond = []
        for entry in entries:
            if entry.get("fallbacks"):
                model = Model.objects.filter(name=entry["name"]).first()
                if model is None:
                    continue
                if problem := model.fallbacks_problem():
                    errors.append(f"model {entry['name']}.fallbacks: {problem}")
                elif wide := reach.model_fallbacks_problem(
                    actor, model, result.before.get(model.name)
                ):
                    beyond.append(wide)
        for engine, version in data.get("engines", {}).items():
            errors += _apply_engine(str(engine), str(version), result)
        errors += catalog_prices.apply(data.get("prices", []), result, actor)
        why = _refusal(actor, result)
        if why is None and beyond:
            why = f"{beyond[0]}; nothing applied"
        if why is not None:
            transaction.set_rollback(True)
            raise permissions.Refused(why)
        if errors:
            transaction.set_rollback(True)
            raise CatalogError(errors)
        if dry_run:
            transaction.set_rollback(True)
    if not dry_run:
        for line in result.changes:
            logger.info("catalog applied: %s", line)
    return result


def _apply_engine(engine: str, version: str, result: ApplyResult) -> list[str]:
    where = f"engines.{engine}"
    row = WantedEngine.objects.filter(engine=engine).first()
    if row is not None and row.version == version:
        result.unchanged.append(f"engine {engine}")
        return []
    before = row.version if row else None
    result.need("engine.change" if row else "engine.add", where)
    row = row or WantedEngine(engine=engine)
    row.version = version
    try:
        row.full_clean()
    except ValidationError as exc:
        return _messages(where, exc)
    row.save()  # every connected node hears of it (fleet.signals)
    if before:
        result.changes.append(f"engine {engine}: version {before} -> {version}")
    else:
        result.changes.append(f"engine {engine} {version} wanted")
    return []


def _apply_model(entry, model_defaults, profile_defaults, result, author) -> list[str]:
    name = entry["name"]
    where = f"model {name}"
    model = Model.objects.filter(name=name).first()
    created = model is None
    if not created:
        result.before[name] = (model.team_id, list(model.fallbacks or ()))
    model = model or Model(name=name)
    values = {MODEL_KEYS[k]: v for k, v in entry.items() if k in MODEL_KEYS}
    if not created and "replicas" not in entry and "max_replicas" in entry:
        # Autoscaled: desired replicas is the autoscaler's to move; a file that
        # does not name it leaves it where it is (the bounds still apply).
        values["desired_replicas"] = model.desired_replicas
    diffs = _assign(model, values, model_defaults)
    before_team, needs_before = model.team_id, sum(map(len, result.needs.values()))
    if problem := _assign_team(model, entry, created, author["actor"], diffs):
        return [f"{where}.team: {problem}"]
    model.fallbacks_checked_later = True  # by apply(), once the whole file is in
    model.canary_checked_later = True  # below, once its profiles are in
    errors = _validate(model, where, exclude=["active_profile"])
    if errors:
        # Still check its profiles, so one run reports every problem.
        for prof in entry.get("profiles", []):
            unsaved = EngineProfile(model=model, name=prof["name"])
            _assign(unsaved, {k: v for k, v in prof.items() if k != "name"}, profile_defaults)
            errors += _validate(unsaved, f"profile {name}/{prof['name']}", exclude=["model"])
        return errors
    if created or diffs:
        model.save()
    errors = []
    for prof in entry.get("profiles", []):
        errors += _apply_profile(model, prof, profile_defaults, result, author)
    for adapter in entry.get("adapters", []):
        errors += _apply_adapter(model, adapter, result)
    active = entry.get("profile")
    if active is None and len(entry.get("profiles", [])) == 1:
        active = entry["profiles"][0]["name"]  # the only one there is
    if active is not None:
        profile = EngineProfile.objects.filter(model=model, name=active).first()
        if profile is None:
            errors.append(f"{where}.profile: no profile named '{active}' for this model")
        elif model.active_profile_id != profile.pk:
            old = model.active_profile.name if model.active_profile_id else None
            diffs.append(f"active profile {old!r} → {active!r}")
            model.active_profile = profile
            model.save()
    errors += _apply_canary(model, entry.get("canary_profile"), where, diffs)
    if errors:
        return errors
    if created:
        result.need("model.add", where)
    elif diffs:
        result.need("model.change", where)
    if sum(map(len, result.needs.values())) > needs_before:
        # Its team's members change it: the team it had, and the one it gets.
        if not created:
            result.scopes.append((before_team, where))
        result.scopes.append((model.team_id, where))
    if created:
        result.changes.append(f"model {name} created")
    elif diffs:
        result.changes.append(f"model {name}: " + ", ".join(diffs))
    else:
        result.unchanged.append(f"model {name}")
    return []


def _assign_team(model, entry, created: bool, actor, diffs: list[str]) -> str | None:
    """The file's ``team`` (a team's name, or null for none) on ``model``; a model new to
    the catalog with none named is its author's team (``teams.team_for_new``), one
    already there keeps its own. Returns what is wrong with the name, else None."""
    if "team" in entry:
        name = entry["team"]
        if name is not None and not isinstance(name, str):
            return f"a team's name, or null for none (got {name!r})"
        team = Team.objects.filter(name=name).first() if name else None
        if name and team is None:
            known = ", ".join(Team.objects.values_list("name", flat=True)) or "none"
            return f"no team named '{name}' (teams: {known})"
    elif created:
        try:
            team = teams.team_for_new(actor, None, f"model '{model.name}'")
        except permissions.Refused as exc:
            return str(exc)
    else:
        return None
    if model.team_id != (team.pk if team else None):
        diffs.append(f"team {model.team.name if model.team_id else None!r} → "
                     f"{team.name if team else None!r}")  # fmt: skip
        model.team = team
    return None


def _apply_canary(model, name, where: str, diffs: list[str]) -> list[str]:
    """The file's canary_profile (a profile's name, or none) with its canary_percent."""
    before = model.canary_profile.name if model.canary_profile_id else None
    if name != before:
        profile = EngineProfile.objects.filter(model=model, name=name).first() if name else None
        if name and profile is None:
            return [f"{where}.canary_profile: no profile named '{name}' for this model"]
        model.canary_profile = profile
        diffs.append(f"canary {before!r} → {name!r}")
    model.canary_checked_later = False
    if problems := model.canary_errors():
        return [f"{where}.{field}: {text}" for field, text in problems.items()]
    if name != before:
        model.save()
    return []


def _apply_profile(model, prof, defaults, result, author) -> list[str]:
    where = f"profile {model.name}/{prof['name']}"
    profile = EngineProfile.objects.filter(model=model, name=prof["name"]).first()
    created = profile is None
    before = None if created else EngineProfile(args=profile.args, env=profile.env)
    profile = profile or EngineProfile(model=model, name=prof["name"])
    diffs = _assign(profile, {k: v for k, v in prof.items() if k != "name"}, defaults)
    errors = _validate(profile, where)
    if errors:
        return errors
    if profiles.args_env_changes(before, profile.args, profile.env):
        # Code on every node that runs it: its own permission, and its author kept.
        result.need("profile.args_env", f"{where}: args/env")
        for name, value in profiles.args_env_stamp(
            permissions.user_of(author["actor"]), author["at"]
        ).items():
            setattr(profile, name, value)
    if created or diffs:
        result.need("profile.add" if created else "profile.change", where)
    if created:
        profile.save()
        result.changes.append(f"{where} created")
    elif diffs:
        profile.save()
        result.changes.append(f"{where}: " + ", ".join(diffs))
    return []
