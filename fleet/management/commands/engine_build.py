from django.core.management.base import BaseCommand, CommandError

from fleet.models import VllmBuild
from fleet.services import engines as engine_service
from fleet.services import nodes as node_service
from fleet.services import permissions


class Command(BaseCommand):
    help = (
        "Choose a node's vLLM build: auto (from the driver's CUDA version), cu13, cu129, "
        "or none (vLLM not installed there). The node is told at once."
    )

    def add_arguments(self, parser):
        parser.add_argument("node", help="The node's id.")
        parser.add_argument("build", choices=VllmBuild.values, help="auto, cu13, cu129 or none")
        parser.add_argument("--as", dest="as_user", metavar="USER", help=permissions.AS_HELP)

    def handle(self, *args, node, build, as_user=None, **options):
        try:
            actor = permissions.actor_named(as_user)
            permissions.require_action(actor, "node.vllm_build", "choose a node's vLLM build")
            target = node_service.get_node(node)
        except (permissions.Refused, node_service.NodeNotFound) as exc:
            raise CommandError(str(exc)) from None
        if engine_service.set_vllm_build([target], build, actor):
            told = "told at once" if target.connected else "told when its agent connects"
            self.stdout.write(f"node '{target.pk}': vLLM build {build} ({told})")
        else:
            self.stdout.write(f"node '{target.pk}' already has vLLM build {build}")
