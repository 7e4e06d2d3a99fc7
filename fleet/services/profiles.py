"""Who may set an engine profile's arguments and environment, and the record of who did.

A profile's ``args`` and ``env`` reach the engine process on every node that runs
it: an ``LD_PRELOAD`` or a ``--trust-remote-code`` there is code running on the
fleet. Setting them takes a permission of its own
(``EngineProfile.ARGS_ENV_PERMISSION``) beyond ``change_engineprofile``; the
API's serializer and the admin's forms ask ``args_env_refusal()``, catalog.apply
asks the same permission through fleet.services.permissions, and all three
record the change with ``args_env_stamp()`` (no user for the system: a command
run without ``--as``).
"""

from django.utils import timezone

from fleet.models import EngineProfile


def args_env_changes(before: EngineProfile | None, args, env) -> bool:
    """Whether writing ``args`` and ``env`` changes what ``before`` runs (None: a new profile).

    ``args``/``env`` of None mean "not written" (a partial update).
    """
    old_args, old_env = (before.args, before.env) if before is not None else ([], {})
    return (args is not None and args != old_args) or (env is not None and env != old_env)


def args_env_refusal(user) -> str | None:
    """Why ``user`` may not set args or env, or None when they may."""
    if user is not None and user.is_active and user.has_perm(EngineProfile.ARGS_ENV_PERMISSION):
        return None
    name = user.get_username() if user is not None else "an anonymous caller"
    return (
        f"user '{name}' may not set an engine profile's args or env: they run on the "
        f"nodes' engines, and setting them needs the permission "
        f"'{EngineProfile.ARGS_ENV_PERMISSION}'"
    )


def args_env_stamp(user, now=None) -> dict:
    """The profile's fields that record ``user`` setting its args or env ``now``."""
    return {"args_env_changed_by": user, "args_env_changed_at": now or timezone.now()}
