"""How an llmgw command ends: the exit statuses scripts rely on, and the ``Failure``
that carries one. Changes only when that contract does (README.md lists it)."""

EXIT_OK, EXIT_REFUSED, EXIT_USAGE, EXIT_AUTH, EXIT_UNREACHABLE, EXIT_TIMEOUT = range(6)


class Failure(Exception):
    """Ends the command: ``message`` to stderr, ``code`` as the exit status."""

    def __init__(self, message: str, code: int):
        super().__init__(message)
        self.code = code


def require_yes(args, what: str) -> None:
    """Ends a verb that cannot be undone unless it was given ``--yes``: ``what`` says what
    doing it means, and the message asks for ``--yes``."""
    if not args.yes:
        raise Failure(f"{what}: add --yes to do it", EXIT_USAGE)
