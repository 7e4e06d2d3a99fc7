from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from fleet.models import ApiKeyScope, Team
from fleet.services import api_keys, permissions

LIMIT_OPTIONS = {
    "rpm": "requests_per_minute",
    "tpm": "tokens_per_minute",
    "tokens_per_day": "tokens_per_day",
    "tokens_per_month": "tokens_per_month",
    "max_concurrent": "max_concurrent",
    "share_weight": "share_weight",
}


def add_limit_arguments(parser) -> None:
    """--rpm, --tpm, --tokens-per-day, --tokens-per-month: 0 for none; left out: the default."""
    for option, what in (
        ("--rpm", "requests per minute"),
        ("--tpm", "tokens per minute"),
        ("--tokens-per-day", "a token budget per UTC day"),
        ("--tokens-per-month", "a token budget per UTC month"),
    ):
        parser.add_argument(
            option, type=int, help=f"Limit: {what}. 0: none; left out: the gateway's default."
        )
    parser.add_argument(
        "--max-concurrent", type=int, help="Requests in flight at once; more wait. 0: no bound."
    )
    parser.add_argument(
        "--share-weight", type=int, help="Its share (1-100) when a model is busy (default 1)."
    )


def limits_from(options) -> dict:
    return {f: options[o] for o, f in LIMIT_OPTIONS.items() if options.get(o) is not None}


class Command(BaseCommand):
    help = "Create an API key for the gateway or the management API; prints its secret once."

    def add_arguments(self, parser):
        parser.add_argument("name", help="Who or what it is for.")
        parser.add_argument(
            "--scope",
            choices=ApiKeyScope.values,
            default=ApiKeyScope.INFERENCE,
            help="inference: the gateway /v1/*; manage: the management API (default inference).",
        )
        parser.add_argument(
            "--user",
            help="Whose key it is (a manage key acts as them). With --as and left out: "
            "that user's own.",
        )
        parser.add_argument(
            "--models", default="", help="Comma-separated models an inference key may use."
        )
        parser.add_argument(
            "--fallbacks",
            default="",
            help="Comma-separated models to answer through an inference key, in order, when "
            "the model asked for cannot.",
        )
        parser.add_argument("--expires", help="When it expires: 30d, 12h… or an ISO 8601 time.")
        parser.add_argument(
            "--team", help="The team that owns it. With --as and left out: that user's team."
        )
        add_limit_arguments(parser)
        parser.add_argument("--as", dest="as_user", metavar="USER", help=permissions.AS_HELP)

    def handle(
        self,
        *args,
        name,
        scope,
        user,
        models,
        fallbacks,
        expires,
        team=None,
        as_user=None,
        **options,
    ):
        try:
            actor = permissions.actor_named(as_user)
        except permissions.Refused as exc:
            raise CommandError(str(exc)) from None
        owner = permissions.user_of(actor)
        if user:
            User = get_user_model()
            try:
                owner = User.objects.get(**{User.USERNAME_FIELD: user})
            except User.DoesNotExist:
                raise CommandError(f"no user '{user}'") from None
        owning = None
        if team:
            owning = Team.objects.filter(name=team).first()
            if owning is None:
                known = ", ".join(Team.objects.values_list("name", flat=True)) or "none"
                raise CommandError(f"no team named '{team}' (teams: {known})")
        try:
            expires_at = api_keys.parse_expiry(expires) if expires else None
            key, secret = api_keys.create_api_key(
                name,
                scope=scope,
                user=owner,
                allowed_models=[m.strip() for m in models.split(",") if m.strip()],
                expires_at=expires_at,
                limits=limits_from(options),
                fallbacks=[m.strip() for m in fallbacks.split(",") if m.strip()],
                team=owning,
                actor=actor,
            )
        except (permissions.Refused, ValueError) as exc:
            raise CommandError(str(exc)) from None
        expiry = f"expires {key.expires_at:%Y-%m-%d %H:%M} UTC" if key.expires_at else "no expiry"
        self.stderr.write(
            f"{key.scope} key '{key.name}' ({key.prefix}), {expiry}. The secret is shown only once:"
        )
        self.stdout.write(secret)
