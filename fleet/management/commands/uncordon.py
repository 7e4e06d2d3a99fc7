from django.core.management.base import BaseCommand, CommandError

from fleet.services import nodes as node_service
from fleet.services import permissions


class Command(BaseCommand):
    help = "Uncordon a node: placements allowed again (this also ends a drain)."

    def add_arguments(self, parser):
        parser.add_argument("node", help="The node's id.")
        parser.add_argument("--as", dest="as_user", metavar="USER", help=permissions.AS_HELP)

    def handle(self, *args, node, as_user=None, **options):
        try:
            permissions.require_action(permissions.actor_named(as_user), "node.uncordon")
            target = node_service.get_node(node)
        except (permissions.Refused, node_service.NodeNotFound) as exc:
            raise CommandError(str(exc)) from None
        if node_service.uncordon(target):
            self.stdout.write(f"node '{target.pk}' uncordoned")
        else:
            self.stdout.write(f"node '{target.pk}' was not cordoned")
