"""Credentials: join tokens for enrolling nodes, and gateway or management-API keys made,
rotated and revoked (each secret printed once). Changes when what an operator does
to a token or key does; a node's own credentials are revoked in ``nodes``.
"""

from __future__ import annotations

from agentd.ctl.client import Api, quote
from agentd.ctl.exits import require_yes
from agentd.ctl.output import Output
from agentd.ctl.verb import Verb


def _secret(path: str, fields):
    def run(api: Api, args, show: Output) -> None:
        made = api.call("POST", path, fields(args))
        if show.json(made):
            return
        expiry = made.get("expires_at") or "never"
        show.secret(
            f"'{made['name']}' ({made['prefix']}), expires {expiry}. "
            "The secret is shown only once:",
            made["secret"],
        )

    return run


def _names(text: str) -> list[str]:
    return [m.strip() for m in text.split(",") if m.strip()]


def _join_token_fields(a) -> dict:
    return {"name": a.name, "ttl": a.ttl, "uses": a.uses}


def _join_token_arguments(p) -> None:
    p.add_argument("name")
    p.add_argument("--ttl", default="24h", help="Lifetime: 30m, 24h, 7d… (default 24h).")
    p.add_argument("--uses", type=int, default=1, help="How many nodes it may enrol.")


def _api_key_fields(a) -> dict:
    return {
        "name": a.name,
        "scope": a.scope,
        "models": _names(a.models),
        "fallbacks": _names(a.fallbacks),
        **({"expires": a.expires} if a.expires else {}),
        **({"max_concurrent": a.max_concurrent} if a.max_concurrent is not None else {}),
        **({"share_weight": a.share_weight} if a.share_weight is not None else {}),
        **({"user": a.user} if a.user else {}),
        **({"team": a.team} if a.team else {}),
    }


def _api_key_arguments(p) -> None:
    p.add_argument("name")
    p.add_argument("--scope", choices=["inference", "manage"], default="inference")
    p.add_argument("--models", default="", help="Inference keys: a,b (default: every model).")
    p.add_argument(
        "--fallbacks",
        default="",
        help="Inference keys: a,b to answer in order when the model asked for cannot.",
    )
    p.add_argument("--expires", help="30d, 12h… or an ISO 8601 time.")
    p.add_argument(
        "--max-concurrent", type=int, help="Requests in flight at once; more wait. 0: no bound."
    )
    p.add_argument(
        "--share-weight", type=int, help="Its share (1-100) when a model is busy (default 1)."
    )
    p.add_argument(
        "--user",
        help="Whose key it is (default: yours, the manage key's user); another user's "
        "needs the permission fleet.manage_others_api_keys.",
    )
    p.add_argument("--team", help="The team that owns it (default: yours, if you are in one).")


def _revoke_key(api: Api, args, show: Output) -> None:
    require_yes(args, f"revoking key {args.prefix} refuses it from now on and cannot be undone")
    result = api.call("POST", f"api-keys/{quote(args.prefix)}/revoke/")
    if show.json(result):
        return
    done = "revoked" if result["revoked"] else "was already revoked"
    show.line(f"'{result['name']}' ({result['prefix']}) {done}")


def _revoke_key_arguments(p) -> None:
    p.add_argument("prefix", help="The key's prefix (the 8 characters after lgk_).")
    p.add_argument("--yes", action="store_true", help="Yes, refuse it from now on.")


def _rotate(api: Api, args, show: Output) -> None:
    made = api.call("POST", f"api-keys/{quote(args.prefix)}/rotate/", {"grace": args.grace})
    if show.json(made):
        return
    show.secret(
        f"'{made['name']}' ({made['prefix']}) rotated; the old secret works until "
        f"{made.get('old_secret_until') or 'now'}. The new secret is shown only once:",
        made["secret"],
    )


def _rotate_arguments(p) -> None:
    p.add_argument("prefix", help="The key's prefix (the 8 characters after lgk_).")
    p.add_argument("--grace", default="24h", help="How long the old secret still works.")


VERBS = {
    "join-token": Verb(
        "A join token for enrolling nodes (secret printed once).",
        _secret("join-tokens/", _join_token_fields),
        _join_token_arguments,
    ),
    "api-key": Verb(
        "A gateway or management-API key (secret printed once).",
        _secret("api-keys/", _api_key_fields),
        _api_key_arguments,
    ),
    "revoke-key": Verb(
        "Refuse an API key from now on (cannot be undone).", _revoke_key, _revoke_key_arguments
    ),
    "rotate-key": Verb(
        "A new secret for a key; the old one works for --grace.", _rotate, _rotate_arguments
    ),
}
