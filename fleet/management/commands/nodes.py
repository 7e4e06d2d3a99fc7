from dataclasses import asdict

from django.core.management.base import BaseCommand

from agentd import tables
from fleet.services import nodes as node_service


class Command(BaseCommand):
    help = "List the fleet's nodes: state, CPU, memory, GPUs, engines, shards, and engine installs."

    def handle(self, *args, **options):
        rows = node_service.node_rows()
        if not rows:
            self.stdout.write("no nodes yet: enrol one with a join token (create_join_token)")
            return
        for line in tables.node_lines([asdict(row) for row in rows]):
            self.stdout.write(line)
