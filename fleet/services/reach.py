"""What a change may reach beyond its team: other teams' models, and the fleet's capacity.

Scope (fleet.services.teams) says whose objects an actor changes. This module
says what those objects may point at, whatever the door (docs/security.md,
"Teams"):

- **Fallbacks.** A model's fallbacks name models of its own team or the fleet's
  (no team): naming another team's would serve its overflow on that team's
  replicas. An API key's fallbacks and allowed models may not name a model kept
  to another team's keys (``Model.private``): the gateway would refuse it anyway.
  Someone with ``fleet.manage_all_teams`` may set a model's fallbacks across
  teams; nobody gives a key a model it may not call.
- **A team's capacity rights.** Its maximum priority (a model's priority is
  bounded by it: ``Model.clean``) and its guaranteed GPU memory are set only by
  those with ``fleet.manage_all_teams``: they decide whose replicas others may
  preempt (fleet.services.preemption).

Each refusal names the team and the bound. The checks that need no actor live
on the models' ``clean()`` (a priority above the team's maximum, a private model
of no team); these need the actor, and each door asks them before it saves.
"""

from __future__ import annotations

from fleet.models import Adapter, Model, Team

from .permissions import MANAGE_ALL_TEAMS, manages_all, name_of

# Team fields that decide whose replicas may be preempted: manage_all_teams sets them.
CAPACITY_FIELDS = {
    "max_priority": "maximum priority",
    "guaranteed_gpu_memory_gb": "guaranteed GPU memory",
}


def _manages_all(actor) -> bool:
    return actor is not None and manages_all(actor)


def model_fallbacks_problem(actor, model: Model, before: tuple | None = None) -> str | None:
    """Why ``actor`` may not give ``model`` (its team and fallbacks as they would be
    saved) its fallbacks, or None. ``before`` is (team id, fallbacks) as stored, None
    for a new model: only names it adds (all of them, when its team changes) are
    judged, so a member can still edit a model someone else gave a wider reach."""
    if _manages_all(actor) or not model.fallbacks or not isinstance(model.fallbacks, list):
        return None
    names = [n for n in model.fallbacks if isinstance(n, str)]
    if before is not None and before[0] == model.team_id:
        kept = set(before[1] or ())
        names = [n for n in names if n not in kept]
    if not names:
        return None
    found = Model.objects.filter(name__in=names, team__isnull=False)
    if model.team_id is not None:
        found = found.exclude(team_id=model.team_id)
    others = list(found.order_by("name").values_list("name", "team__name"))
    if not others:
        return None
    own = Team.objects.filter(pk=model.team_id).values_list("name", flat=True).first()
    named = ", ".join(f"'{n}' (team '{t}')" for n, t in others)
    whose = f"team '{own}'" if own else "no team (the fleet's)"
    return (
        f"{name_of(actor)} may not make model '{model.name}' of {whose} fall back to "
        f"{named}: a model's fallbacks are its own team's models or the fleet's (or need "
        f"the permission {MANAGE_ALL_TEAMS})"
    )


def key_models_problem(team_id: int | None, names, what: str) -> str | None:
    """Why a key of team ``team_id`` may not name ``names`` as its ``what`` ("allowed
    models", "fallbacks"): any of them kept to another team's keys. None when it may."""
    names = [n for n in (names or ()) if isinstance(n, str)]
    if not names:
        return None
    found = Model.objects.filter(name__in=names, private=True)
    # An adapter of a kept model is kept with it: the gateway refuses it to other keys.
    adapters = Adapter.objects.filter(name__in=names, model__private=True)
    if team_id is not None:
        found = found.exclude(team_id=team_id)
        adapters = adapters.exclude(model__team_id=team_id)
    kept = sorted(
        [
            *found.values_list("name", "team__name"),
            *adapters.values_list("name", "model__team__name"),
        ]
    )
    if not kept:
        return None
    named = ", ".join(f"'{n}' (team '{t}')" for n, t in kept)
    mine = Team.objects.filter(pk=team_id).values_list("name", flat=True).first()
    whose = f"of team '{mine}'" if mine else "of no team"
    return (
        f"a key {whose} may not name {named} in its {what}: "
        f"{'those models are' if len(kept) > 1 else 'that model is'} kept to "
        "their team's keys"
    )


def team_capacity_problem(actor, team: Team, before: Team | None) -> str | None:
    """Why ``actor`` may not set ``team``'s capacity rights as they would be saved
    (``before``: as stored, None for a new team), or None."""
    if _manages_all(actor):
        return None
    changed = [
        label
        for field, label in CAPACITY_FIELDS.items()
        if getattr(team, field) != (getattr(before, field) if before else _default(field))
    ]
    if not changed:
        return None
    return (
        f"{name_of(actor)} may not set the {' and '.join(changed)} of team '{team.name}': "
        f"it needs the permission {MANAGE_ALL_TEAMS} (it decides whose replicas may be "
        "preempted)"
    )


def _default(field: str):
    return Team._meta.get_field(field).get_default()
