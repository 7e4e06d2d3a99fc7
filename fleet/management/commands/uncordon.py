from django.core.management.base import BaseCommand, CommandError

from fleet.services import nodes as node_service


class Command(BaseCommand):
    help = "Uncordon a node: placements allowed again (this also ends a drain)."

    def add_arguments(self, parser):
        parser.add_argument("node", help="The node's id.")

    def handle(self, *args, node, **options):
        try:
            target = node_service.get_node(node)
        except node_service.NodeNotFound as exc:
            raise CommandError(str(exc)) from None
        if node_service.uncordon(target):
            self.stdout.write(f"node '{target.pk}' uncordoned")
        else:
            self.stdout.write(f"node '{target.pk}' was not cordoned")
