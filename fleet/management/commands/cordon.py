from django.core.management.base import BaseCommand, CommandError

from fleet.services import nodes as node_service
from fleet.services import permissions


class Command(BaseCommand):
    help = "Cordon a node: no new placements on it."

    def add_arguments(self, parser):
        parser.add_argument("node", help="The node's id.")
        parser.add_argument("--as", dest="as_user", metavar="USER", help=permissions.AS_HELP)

    def handle(self, *args, node, as_user=None, **options):
        try:
            permissions.require_action(permissions.actor_named(as_user), "node.cordon")
            target = node_service.get_node(node)
        except (permissions.Refused, node_service.NodeNotFound) as exc:
            raise CommandError(str(exc)) from None
        if node_service.cordon(target):
            self.stdout.write(f"node '{target.pk}' cordoned")
        else:
            self.stdout.write(f"node '{target.pk}' was already cordoned")
