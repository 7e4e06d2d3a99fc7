from django.core.management.base import BaseCommand, CommandError

from fleet.services import gpu_health, permissions


class Command(BaseCommand):
    help = (
        "Clear a GPU's fault, with a reason: it may be placed on again. "
        "docs/operations.md, 'GPU faults and notices'."
    )

    def add_arguments(self, parser):
        parser.add_argument("action", choices=["clear"])
        parser.add_argument(
            "gpu", help="NODE/INDEX, like gpu-07/3 (or gpu-07/gpu3, as pages show it)."
        )
        parser.add_argument(
            "--reason", required=True, help="Why it is fine again; the audit trail keeps it."
        )
        parser.add_argument("--as", dest="as_user", metavar="USER", help=permissions.AS_HELP)

    def handle(self, *args, action, gpu, reason, as_user=None, **options):
        try:
            actor = permissions.actor_named(as_user)
            _changed, text = gpu_health.clear(gpu_health.get_gpu(gpu), actor, reason)
        except (permissions.Refused, gpu_health.GPUNotFound, ValueError) as exc:
            raise CommandError(str(exc)) from None
        self.stdout.write(text)
