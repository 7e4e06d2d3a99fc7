from django.core.management.base import BaseCommand, CommandError

from fleet.models import Node
from fleet.services.units import bytes_text
from fleet.services.weights_gc import inventory

HEADERS = ("NODE", "PATH", "SIZE", "LAST USED", "IN USE BY", "PINNED", "SOURCE")


class Command(BaseCommand):
    help = "List weights on nodes: size, last use, what uses them, pinned."

    def add_arguments(self, parser):
        parser.add_argument("--node", help="Only this node's weights.")
        parser.add_argument(
            "--unused", action="store_true", help="Only entries no desired or running shard needs."
        )

    def handle(self, *args, node=None, unused=False, **options):
        if node and not Node.objects.filter(pk=node).exists():
            raise CommandError(f"no node '{node}'")
        items = inventory.listing(node, unused=unused)
        if not items:
            self.stdout.write("no weights" + (" unused" if unused else "") + " on record")
            return
        table = [list(HEADERS)] + [
            [
                i.row.node_id,
                i.row.path,
                bytes_text(i.row.size_bytes),
                i.last_used_text,
                ", ".join(i.used_by) or "-",
                "yes" if i.row.pinned else "no",
                i.row.source or "-",
            ]
            for i in items
        ]
        widths = [max(len(r[c]) for r in table) for c in range(len(HEADERS))]
        for r in table:
            line = "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True))
            self.stdout.write(line.rstrip())
