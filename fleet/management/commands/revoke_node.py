from django.core.management.base import BaseCommand, CommandError

from fleet.services import access, permissions
from fleet.services import nodes as node_service


class Command(BaseCommand):
    help = "Revoke every credential of a node and disconnect its agent."

    def add_arguments(self, parser):
        parser.add_argument("node", help="The node's id.")
        parser.add_argument(
            "--no-input",
            "--noinput",
            action="store_false",
            dest="interactive",
            help="Do not ask for confirmation.",
        )
        parser.add_argument("--as", dest="as_user", metavar="USER", help=permissions.AS_HELP)

    def handle(self, *args, node, interactive, as_user=None, **options):
        try:
            actor = permissions.actor_named(as_user)
            permissions.require_action(actor, "node.revoke", f"revoke node '{node}'")
            target = node_service.get_node(node)
        except (permissions.Refused, node_service.NodeNotFound) as exc:
            raise CommandError(str(exc)) from None
        if interactive:
            answer = input(
                f"Revoke node '{target.pk}'? Its agent is disconnected and must enrol again "
                "with a new join token. Type 'yes' to continue: "
            )
            if answer.strip().lower() != "yes":
                raise CommandError("revocation cancelled")
        count = access.revoke_node(target, actor)
        self.stdout.write(f"revoked {count} credential(s) of node '{target.pk}'")
