from django.core.management.base import BaseCommand

from fleet.services import nodes as node_service

COLUMNS = (
    ("NODE", "node"),
    ("STATE", "state"),
    ("CPU %", "cpu_percent"),
    ("MEM (GB)", "memory_gb"),
    ("GPUS", "gpus"),
    ("ENGINES", "engines"),
    ("SHARDS (READY/ALL)", "shards"),
    ("VLLM BUILD", "vllm_build"),
    ("INSTALLS", "installs"),
)


class Command(BaseCommand):
    help = "List the fleet's nodes: state, CPU, memory, GPUs, engines, shards, and engine installs."

    def handle(self, *args, **options):
        rows = node_service.node_rows()
        if not rows:
            self.stdout.write("no nodes yet: enrol one with a join token (create_join_token)")
            return
        table = [[h for h, _ in COLUMNS]] + [
            [str(getattr(row, attr)) for _, attr in COLUMNS] for row in rows
        ]
        widths = [max(len(r[i]) for r in table) for i in range(len(COLUMNS))]
        for r in table:
            self.stdout.write(
                "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
            )
