from django.core.management.base import BaseCommand, CommandError

from fleet.services import drain, permissions
from fleet.services import nodes as node_service


class Command(BaseCommand):
    help = "Drain a node: move its replicas elsewhere (replacements ready first), then cordon it."

    def add_arguments(self, parser):
        parser.add_argument("node", help="The node's id.")
        parser.add_argument("--wait", action="store_true", help="Wait until it is drained.")
        parser.add_argument(
            "--timeout", type=float, default=1800, help="Seconds --wait waits (default 1800)."
        )
        parser.add_argument(
            "--no-input", action="store_false", dest="interactive", help="Do not ask to confirm."
        )
        parser.add_argument("--as", dest="as_user", metavar="USER", help=permissions.AS_HELP)

    def handle(self, *args, node, wait, timeout, interactive, as_user=None, **options):
        if timeout < 0:
            raise CommandError(f"--timeout must not be negative (got {timeout:g})")
        try:
            permissions.require_action(permissions.actor_named(as_user), "node.drain")
            target = node_service.get_node(node)
        except (permissions.Refused, node_service.NodeNotFound) as exc:
            raise CommandError(str(exc)) from None
        before = drain.progress(target.pk)
        if interactive and before.waiting:
            answer = input(
                f"Drain node '{target.pk}'? {len(before.waiting)} replica(s) move away. [y/N] "
            )
            if answer.strip().lower() not in ("y", "yes"):
                raise CommandError("drain cancelled")
        if drain.drain_node(target):
            self.stdout.write(f"node '{target.pk}' cordoned and draining")
        else:
            self.stdout.write(f"node '{target.pk}' was already draining")
        if not wait:
            return
        result = drain.wait(target.pk, timeout, lambda p: self.stdout.write(str(p)))
        if not result.done:
            raise CommandError(
                f"node '{target.pk}' not drained after {timeout:g} s; the drain goes on"
            )
