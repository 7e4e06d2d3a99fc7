from django.core.management.base import BaseCommand, CommandError
from django.db import transaction

from fleet.services import catalog, snapshot


class Command(BaseCommand):
    help = "List every node and why it could run a new replica of MODEL, or why not."

    def add_arguments(self, parser):
        parser.add_argument("model", help="The model's name.")
        parser.add_argument("--profile", help="Ask about this profile instead of the active one.")
        parser.add_argument(
            "-f",
            "--file",
            help="A catalog file to consider applied first (nothing is saved): what if.",
        )

    def handle(self, *args, model, profile, file, **options):
        try:
            with transaction.atomic():
                if file:
                    self._apply_for_now(file)
                result = snapshot.explain_model(model, profile)
                transaction.set_rollback(True)  # explain never changes anything
        except snapshot.ExplainError as exc:
            raise CommandError(str(exc)) from None
        for line in result.lines():
            self.stdout.write(line)

    def _apply_for_now(self, file):
        try:
            with open(file, encoding="utf-8") as fh:
                text = fh.read()
        except OSError as exc:
            raise CommandError(f"cannot read {file}: {exc.strerror}") from None
        try:
            catalog.apply(text)
        except catalog.CatalogError as exc:
            lines = "\n".join(f"  {e}" for e in exc.errors)
            raise CommandError(f"{file}:\n{lines}") from None
