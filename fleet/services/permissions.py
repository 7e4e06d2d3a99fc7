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
    "engine.add": ("fleet.add_wantedengine",),
    "engine.change": ("fleet.change_wantedengine",),
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


def require_action(actor, action: str, doing: str | None = None) -> None:
    require(actor, needs(action), doing or action.replace(".", " ").replace("_", " "))


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
