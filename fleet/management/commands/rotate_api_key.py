from django.core.management.base import BaseCommand, CommandError

from fleet.models import ApiKey
from fleet.services import api_keys, permissions


class Command(BaseCommand):
    help = (
        "Give an API key a new secret; the old one keeps working for a grace period. "
        "Prints the new secret once."
    )

    def add_arguments(self, parser):
        parser.add_argument("prefix", help="The key's prefix (the 8 characters after lgk_).")
        parser.add_argument(
            "--grace", default="24h", help="How long the old secret still works (default 24h)."
        )
        parser.add_argument("--as", dest="as_user", metavar="USER", help=permissions.AS_HELP)

    def handle(self, *args, prefix, grace, as_user=None, **options):
        try:
            actor = permissions.actor_named(as_user)
        except permissions.Refused as exc:
            raise CommandError(str(exc)) from None
        key = ApiKey.objects.filter(prefix=prefix).first()
        if key is None:
            raise CommandError(f"no API key with prefix '{prefix}'")
        try:
            secret = api_keys.rotate_api_key(key, api_keys.parse_duration(grace), actor=actor)
        except permissions.Refused as exc:
            raise CommandError(str(exc)) from None
        except (ValueError, OverflowError) as exc:
            raise CommandError(f"--grace {grace}: {exc}") from None
        self.stderr.write(
            f"key '{key.name}' ({key.prefix}) rotated; the old secret works until "
            f"{key.previous_secret_expires_at:%Y-%m-%d %H:%M} UTC. The new secret, shown once:"
        )
        self.stdout.write(secret)
