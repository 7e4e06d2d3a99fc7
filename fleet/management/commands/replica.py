from django.core.management.base import BaseCommand, CommandError

from fleet.models import Replica
from fleet.services import drain, permissions


class Command(BaseCommand):
    help = (
        "Take one replica out of service: drain (a replacement first), stop (the model "
        "wants one fewer) or restart (a new one at once). docs/operations.md, 'One replica'."
    )

    def add_arguments(self, parser):
        parser.add_argument("action", choices=list(drain.EVICT_WORDS))
        parser.add_argument("replica", help="Its id, or MODEL#ID as pages and events print it.")
        parser.add_argument("--as", dest="as_user", metavar="USER", help=permissions.AS_HELP)

    def handle(self, *args, action, replica, as_user=None, **options):
        given = replica.rsplit("#", 1)[-1]
        found = (
            list(Replica.objects.filter(pk__startswith=given).exclude(state="stopped")[:6])
            if given
            else []
        )
        if len(found) != 1:
            raise CommandError(
                f"'{replica}' names {len(found) if len(found) < 6 else 'more than 5'} live "
                "replicas; give more of its id (api/v1/replicas/ lists them)"
            )
        try:
            _changed, text = drain.evict_replica(found[0], action, permissions.actor_named(as_user))
        except permissions.Refused as exc:
            raise CommandError(str(exc)) from None
        self.stdout.write(text)
