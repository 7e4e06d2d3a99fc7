from django.core.management.base import BaseCommand, CommandError

from fleet.services import access, permissions
from fleet.services.api_keys import parse_duration


class Command(BaseCommand):
    help = "Create a join token that lets new nodes enrol; prints its secret once."

    def add_arguments(self, parser):
        parser.add_argument("name", help="What it is for, e.g. 'rack 4'.")
        parser.add_argument("--ttl", default="24h", help="Lifetime: 30m, 24h, 7d… (default 24h).")
        parser.add_argument(
            "--uses", type=int, default=1, help="How many nodes it may enrol (default 1)."
        )
        parser.add_argument("--as", dest="as_user", metavar="USER", help=permissions.AS_HELP)

    def handle(self, *args, name, ttl, uses, as_user=None, **options):
        try:
            token, secret = access.create_join_token(
                name,
                ttl=parse_duration(ttl),
                max_uses=uses,
                actor=permissions.actor_named(as_user),
            )
        except (permissions.Refused, ValueError) as exc:
            raise CommandError(str(exc)) from None
        self.stderr.write(
            f"join token '{token.name}' ({token.prefix}): {token.max_uses} use(s), "
            f"expires {token.expires_at:%Y-%m-%d %H:%M} UTC. The secret is shown only once:"
        )
        self.stdout.write(secret)
