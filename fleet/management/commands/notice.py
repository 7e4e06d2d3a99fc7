from django.core.management.base import BaseCommand, CommandError

from agentd.ctl.times import notice_seconds
from fleet.services import drain, gpu_health, permissions
from fleet.services import nodes as node_service


class Command(BaseCommand):
    help = (
        "Say a node goes away: it drains now, replacements first. "
        "docs/operations.md, 'GPU faults and notices'."
    )

    def add_arguments(self, parser):
        parser.add_argument("node", help="The node's id.")
        parser.add_argument(
            "--in", dest="in_", required=True, metavar="TIME", help="When: 120, 120s, 2m or 1h."
        )
        parser.add_argument("--reason", default="", help="Shown on the node page and the event.")
        parser.add_argument(
            "--no-input", action="store_false", dest="interactive", help="Do not ask to confirm."
        )
        parser.add_argument("--as", dest="as_user", metavar="USER", help=permissions.AS_HELP)

    def handle(self, *args, node, in_, reason, interactive, as_user=None, **options):
        try:
            in_s = notice_seconds(in_)
            actor = permissions.actor_named(as_user)
            permissions.require_action(actor, "node.notice", f"give node {node} notice")
            target = node_service.get_node(node)
        except (ValueError, permissions.Refused, node_service.NodeNotFound) as exc:
            raise CommandError(str(exc)) from None
        waiting = drain.progress(target.pk).waiting
        if interactive and waiting:
            answer = input(
                f"Node '{target.pk}' goes away in {in_s:g} s? {len(waiting)} replica(s) "
                "move away now. [y/N] "
            )
            if answer.strip().lower() not in ("y", "yes"):
                raise CommandError("notice cancelled")
        try:
            text = gpu_health.give_notice(target, in_s, "operator", reason, actor)
        except (ValueError, permissions.Refused) as exc:
            raise CommandError(str(exc)) from None
        self.stdout.write(text)
