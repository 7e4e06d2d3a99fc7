"""What stops the web process at start, with the fix in the message, rather than
answering every request with an error.

``llmgw_site.asgi`` raises it when imported (whatever server imports it), and
``llmgw_site.serve`` asks before it starts uvicorn: with ``--workers N`` a worker
that fails to import would be started again and again by uvicorn's supervisor.
"""

from django.conf import settings


def refusal() -> str | None:
    """Why this process must not serve, or None. Django must be set up."""
    if settings.DEBUG:
        return None
    if not settings.ALLOWED_HOSTS:
        # Django would answer every request 400.
        return (
            "ALLOWED_HOSTS is not set and DEBUG is off: set ALLOWED_HOSTS to the host names "
            "this control plane is reached by, comma-separated (e.g. "
            "ALLOWED_HOSTS=llmgw.example.com)"
        )
    from django.contrib.staticfiles.storage import ManifestFilesMixin, staticfiles_storage

    if isinstance(staticfiles_storage, ManifestFilesMixin) and not (
        staticfiles_storage.manifest_storage.exists(staticfiles_storage.manifest_name)
    ):
        # Every page naming a static file would be a 500: the names come from the
        # manifest collectstatic writes.
        return (
            f"the static files are not collected: {settings.STATIC_ROOT}/"
            f"{staticfiles_storage.manifest_name} is missing, and without it every admin page "
            "is a 500. Run: python manage.py collectstatic --no-input (with this process's "
            "environment; `make run` does it), then start this again"
        )
    return None
