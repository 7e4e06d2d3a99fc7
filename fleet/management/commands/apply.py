import sys

from django.core.management.base import BaseCommand, CommandError

from fleet.services import catalog, permissions


class Command(BaseCommand):
    help = "Apply a catalog file (models and engine profiles): all of it, or nothing."

    def add_arguments(self, parser):
        parser.add_argument("-f", "--file", required=True, help="catalog.yaml, or - for stdin")
        parser.add_argument(
            "--dry-run", action="store_true", help="Say what would change; change nothing."
        )
        parser.add_argument("--as", dest="as_user", metavar="USER", help=permissions.AS_HELP)

    def handle(self, *args, file, dry_run, as_user=None, **options):
        try:
            actor = permissions.actor_named(as_user)
        except permissions.Refused as exc:
            raise CommandError(str(exc)) from None
        try:
            text = sys.stdin.read() if file == "-" else open(file, encoding="utf-8").read()
        except OSError as exc:
            raise CommandError(f"cannot read {file}: {exc.strerror}") from None
        try:
            result = catalog.apply(text, dry_run=dry_run, actor=actor)
        except permissions.Refused as exc:
            raise CommandError(f"{file}: {exc}") from None
        except catalog.CatalogError as exc:
            lines = "\n".join(f"  {e}" for e in exc.errors)
            raise CommandError(f"{file}: nothing applied:\n{lines}") from None
        prefix = "would change: " if dry_run else ""
        for line in result.changes:
            self.stdout.write(prefix + line)
        if not result.changes:
            self.stdout.write("nothing to change")
        elif result.unchanged:
            self.stdout.write(f"unchanged: {', '.join(result.unchanged)}")
