from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone

from fleet.services import api_keys


class Command(BaseCommand):
    help = "Tokens used per API key and model, from the gateways' usage counts."

    def add_arguments(self, parser):
        parser.add_argument("--key", help="A key's prefix or name.")
        parser.add_argument("--model", help="One model.")
        parser.add_argument("--since", default="7d", help="How far back: 24h, 7d… (default 7d).")
        parser.add_argument("--hourly", action="store_true", help="One line per hour, not totals.")

    def handle(self, *args, key, model, since, hourly, **options):
        try:
            start = timezone.now() - api_keys.parse_duration(since)
        except (ValueError, OverflowError) as exc:
            raise CommandError(f"--since {since}: {exc}") from None
        rows = api_keys.usage(key=key, model=model, since=start)
        header = f"{'KEY':<24} {'MODEL':<28} {'REQUESTS':>9} {'PROMPT':>12} {'COMPLETION':>12}"
        if hourly:
            self.stdout.write(f"{'HOUR (UTC)':<17} {header}")
            for r in rows:
                self.stdout.write(
                    f"{r.hour:%Y-%m-%d %H:00} {r.key.name[:24]:<24} {r.model[:28]:<28} "
                    f"{r.requests:>9} {r.prompt_tokens:>12} {r.completion_tokens:>12}"
                )
            return
        totals = api_keys.usage_totals(rows)
        self.stdout.write(header)
        for t in totals:
            self.stdout.write(
                f"{t['key__name'][:24]:<24} {t['model'][:28]:<28} {t['requests']:>9} "
                f"{t['prompt_tokens']:>12} {t['completion_tokens']:>12}"
            )
        if not totals:
            self.stderr.write(f"no usage since {start:%Y-%m-%d %H:%M} UTC")
