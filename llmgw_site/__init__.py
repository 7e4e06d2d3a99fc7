"""The llmgw Django project: settings, ASGI entry point, Celery app, URLs."""

from .celery import app as celery_app

__all__ = ["celery_app"]
