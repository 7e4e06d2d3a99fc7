from django.core.management.base import BaseCommand, CommandError

from fleet.services import permissions
from fleet.services.weights_gc import cleanup


class Command(BaseCommand):
    help = "Run the weights clean-up pass now, or with --dry-run print what would go and why."

    def add_arguments(self, parser):
        parser.add_argument(
            "--dry-run", action="store_true", help="Print what would be removed; change nothing."
        )
        parser.add_argument(
            "--wait",
            type=float,
            default=30.0,
            help="Seconds to wait for a running reconciler pass to let go of the lock.",
        )
        parser.add_argument("--as", dest="as_user", metavar="USER", help=permissions.AS_HELP)

    def handle(self, *args, dry_run=False, wait=30.0, as_user=None, **options):
        try:
            actor = permissions.actor_named(as_user)
            if not dry_run:
                permissions.require_action(actor, "weights.cleanup", "run the weights clean-up")
        except permissions.Refused as exc:
            raise CommandError(str(exc)) from None
        report = cleanup.dry_run() if dry_run else cleanup.run_locked(wait_s=wait)
        if report.skipped:
            raise CommandError(f"a reconciler pass held the lock for {wait:g} s; try again")
        lines = report.lines()
        verb = "would propose" if dry_run else "proposed"
        for line in lines:
            self.stdout.write(line)
        nodes = len({p.entry.node_id for p in report.proposals})
        self.stdout.write(
            f"{verb} {len(report.proposals)} entr{'y' if len(report.proposals) == 1 else 'ies'} "
            f"for removal on {nodes} node{'s' if nodes != 1 else ''}"
            + ("; each node checks every path again before removing it" if not dry_run else "")
        )
