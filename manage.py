#!/usr/bin/env python
"""Django's command-line utility for llmgw."""

import os
import sys


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "llmgw_site.settings")
    from django.core.management import execute_from_command_line

    from fleet import audit

    # Changes a command makes are the audit trail's "manage.py <command>" (--as: by whom).
    with audit.command_scope(sys.argv):
        execute_from_command_line(sys.argv)


if __name__ == "__main__":
    main()
