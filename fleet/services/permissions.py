"""Who may do what: one rule per action, whatever the door (docs/security.md).

Every write the admin, the API, ``llmgw`` and the management commands make is
an action named in ``ACTIONS`` with the Django permissions it needs. The doors
ask this table (the admin's ``has_<x>_permission``, the API's
``action_permissions``, the commands' ``--as``) rather than naming permissions
of their own, so an action cannot be allowed through one door and refused
through another. Where the rule depends on what an action touches (whose API
key it is, what a catalog file changes), the service checks it itself:
fleet.services.api_keys, fleet.services.catalog.

``SYSTEM`` is the actor of code that holds the database already: a management
command run without ``--as`` (shell access to the control plane is all of it),
Celery tasks, tests. It may do anything; what it sets is recorded as set by no
user, as the command line. The generated test (tests/security/) walks every
door against this table.
"""

from __future__ import annotations

from django.contrib.auth import get_user_model

from fleet import audit


class Refused(Exception):
    """An actor may not do this. The message names who, what, and the permission missing."""


class _System:
    """The actor with the database in hand (see the module's docstring)."""

    def __repr__(self) -> str:
        return "SYSTEM"


SYSTEM = _System()

# Minting, rotating or revoking an API key that is not one's own (another user's,
# or a key of nobody's): a key acts as its owner, so this is acting as them.
OTHERS_API_KEYS = "fleet.manage_others_api_keys"
# Setting a profile's args or env: code on every node that runs it.
ARGS_ENV = "fleet.set_engine_args_env"

# Action -> the permissions it needs, all of them. Reading what an action
# shows (the node a cordon answers with) needs the view permission as well.
ACTIONS: dict[str, tuple[str, ...]] = {
    "node.cordon": ("fleet.drain_node",),
    "node.drain": ("fleet.drain_node",),
    "node.uncordon": ("fleet.drain_node",),
    "node.revoke": ("fleet.change_node",),
    "node.vllm_build": ("fleet.change_node",),
    # Saying a node goes away drains it; clearing a GPU's fault lets work on it again.
    "node.notice": ("fleet.drain_node",),
    "gpu.clear": ("fleet.drain_node",),
    "replica.drain": ("fleet.drain_replica",),
    "replica.stop": ("fleet.drain_replica",),
    "replica.restart": ("fleet.drain_replica",),
    "weights.pin": ("fleet.change_localweights",),
    "weights.unpin": ("fleet.change_localweights",),
    "weights.remove": ("fleet.change_localweights",),
    "weights.cleanup": ("fleet.change_localweights",),
    "join_token.create": ("fleet.add_jointoken",),
    "join_token.revoke": ("fleet.change_jointoken",),
    # Each also needs OTHERS_API_KEYS for a key that is not the actor's own.
    "api_key.create": ("fleet.add_apikey",),
    "api_key.rotate": ("fleet.change_apikey",),
    "api_key.revoke": ("fleet.change_apikey",),
    "api_key.set_limits": ("fleet.change_apikey",),
    # A catalog file needs, per change, what the per-object API needs for it
    # (fleet.services.catalog): these are its parts.
    "model.add": ("fleet.add_model",),
    "model.change": ("fleet.change_model",),
    "model.canary": ("fleet.change_model",),  # promote or abort it
    "profile.add": ("fleet.add_engineprofile",),
    "profile.change": ("fleet.change_engineprofile",),
    "profile.args_env": (ARGS_ENV,),
    "adapter.add": ("fleet.add_adapter",),
    "adapter.change": ("fleet.change_adapter",),
    "engine.add": ("fleet.add_wantedengine",),
    "engine.change": ("fleet.change_wantedengine",),
    "team.add": ("fleet.add_team",),
    "team.change": ("fleet.change_team",),
    # A price from a date on: it prices the hours counted since that date too.
    "price.set": ("fleet.add_price",),
}


def needs(action: str) -> tuple[str, ...]:
    """The permissions ``action`` needs; KeyError for an action nobody named here."""
    return ACTIONS[action]


def user_of(actor):
    """The user an actor is, for records (who set args/env): None for SYSTEM."""
    return None if actor is SYSTEM else actor


def name_of(actor) -> str:
    if actor is SYSTEM:
        return "the system"
    if actor is None or not getattr(actor, "is_authenticated", False):
        return "an anonymous caller"
    return f"user '{actor.get_username()}'"


def missing(actor, perms) -> list[str]:
    """Which of ``perms`` the actor lacks: none for SYSTEM; all for a user who is not active
    staff (the admin and the API let only staff in; ``--as`` asks the same)."""
    if actor is SYSTEM:
        return []
    if not (getattr(actor, "is_active", False) and getattr(actor, "is_staff", False)):
        return list(perms)
    return [p for p in perms if not actor.has_perm(p)]


def allowed(actor, action: str) -> bool:
    return not missing(actor, needs(action))


def require(actor, perms, doing: str) -> None:
    """Raise Refused, naming what is missing, unless the actor has every one of ``perms``."""
    if lacking := missing(actor, perms):
        raise Refused(
            f"{name_of(actor)} may not {doing}: it needs the permission"
            f"{'s' if len(lacking) > 1 else ''} {', '.join(lacking)}"
        )


def require_action(actor, action: str, doing: str | None = None, *, on=None) -> None:
    """Raise Refused unless the actor has the action's permissions and, for an action
    ``on`` a model, profile, replica or API key, that object is in their team's scope
    (fleet.services.teams)."""
    doing = doing or action.replace(".", " ").replace("_", " ")
    require(actor, needs(action), doing)
    if on is not None and (why := scope_problem(actor, team_of(on), doing)):
        raise Refused(why)


# ---- teams' scope ----------------------------------------------------------------------
#
# On top of an action's permissions: a member of a team changes only what that team
# owns (models, their profiles and replicas, API keys), someone in no team only what
# belongs to no team, and MANAGE_ALL_TEAMS (superusers have it) everything. The
# admin and the API ask it as object permissions (fleet.services.teams).

MANAGE_ALL_TEAMS = "fleet.manage_all_teams"


def team_of(obj) -> int | None:
    """The id of the team that owns ``obj`` (a model, its profile, replica or adapter, or an
    API key)."""
    from fleet.models import Adapter, ApiKey, EngineProfile, Model, Replica

    if isinstance(obj, Model | ApiKey):
        return obj.team_id
    if isinstance(obj, EngineProfile | Replica | Adapter):
        return obj.model.team_id
    raise TypeError(f"{type(obj).__name__} belongs to no team")


def teams_of(user) -> dict[int, str]:
    """The teams ``user`` is a member of, id -> name; kept on the user for its request."""
    from fleet.models import Team

    cached = getattr(user, "_llmgw_teams", None)
    if cached is None:
        cached = dict(
            Team.objects.filter(group__user=user).order_by("name").values_list("pk", "name")
        )
        user._llmgw_teams = cached
    return cached


def manages_all(actor) -> bool:
    return actor is SYSTEM or actor.has_perm(MANAGE_ALL_TEAMS)


def team_names(teams: dict[int, str]) -> str:
    return ", ".join(f"'{n}'" for n in teams.values())


def scope_problem(actor, team_id: int | None, what: str) -> str | None:
    """Why ``actor`` may not ``what`` (e.g. "change model 'llama'") of team ``team_id``
    (None: the fleet's), or None when they may."""
    if actor is SYSTEM or not getattr(actor, "is_authenticated", False):
        return None  # the permission check refuses the anonymous already
    if manages_all(actor):
        return None
    mine = teams_of(actor)
    if team_id is None:
        if not mine:
            return None
        return (
            f"{name_of(actor)} may not {what}: it belongs to no team, and they may change "
            f"only what team {team_names(mine)} owns (or need the permission "
            f"{MANAGE_ALL_TEAMS})"
        )
    if team_id in mine:
        return None
    from fleet.models import Team

    owner = Team.objects.filter(pk=team_id).values_list("name", flat=True).first()
    return (
        f"{name_of(actor)} may not {what}: it belongs to team '{owner}', and they are "
        f"{'in team ' + team_names(mine) if mine else 'in no team'} (or need the permission "
        f"{MANAGE_ALL_TEAMS})"
    )


AS_HELP = (
    "Act as this user, with their permissions, and record them as the author. "
    "Without it the command acts as the system: anything is allowed (shell access is "
    "the control plane's keys) and what it sets is recorded as set by no user."
)


def actor_named(username: str | None):
    """The actor a management command runs as: SYSTEM without ``--as``, else that user.

    Raises Refused for an unknown or inactive user: acting as nobody by a typo
    must not fall back to acting as the system.
    """
    if not username:
        return SYSTEM
    User = get_user_model()
    user = User.objects.filter(**{User.USERNAME_FIELD: username}).first()
    if user is None:
        raise Refused(f"--as {username}: no such user")
    if not user.is_active:
        raise Refused(f"--as {username}: the user is inactive")
    audit.act_as(user)  # the command's changes are this user's in the audit trail
    return user
