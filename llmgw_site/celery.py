"""The Celery app: reconciliation and clean-ups run here (see fleet/tasks.py)."""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "llmgw_site.settings")
# Celery's Django fix-up runs Django's system checks at every worker and beat
# start: the whole URLconf, the admin and the API imported, a third of a second
# of CPU a start. The deploy runs them once (`manage.py migrate`, `manage.py check
# --deploy`, docs/operations.md) and the web process never does, so a worker
# restarted by its supervisor need not; set CELERY_SKIP_CHECKS= (empty) for them.
os.environ.setdefault("CELERY_SKIP_CHECKS", "1")

app = Celery("llmgw")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


def _survive_a_lost_redis() -> None:
    """Keep a worker alive through a Redis outage (kombu's Redis transport, 5.x).

    When the broker connection drops, the worker closes its channel, and
    closing restores unacknowledged messages through a new connection pool,
    built from the transport's connection, which closing has already released
    (None): an AttributeError, which no one expects, and the worker's consumer
    dies instead of reconnecting. Seen in tests/e2e/test_faults_control_plane.py
    (Redis stopped for 30 s). Raising the connection error it really is lets
    kombu ignore it on close and reconnect as designed; the unacknowledged
    messages come back by the visibility timeout instead.
    """
    import redis
    from kombu.transport import redis as kombu_redis

    connparams = kombu_redis.Channel._connparams
    if getattr(connparams, "_llmgw_guarded", False):
        return

    def guarded(self, asynchronous=False):
        if self.connection.client is None:
            raise redis.exceptions.ConnectionError("the broker connection was already released")
        return connparams(self, asynchronous)

    guarded._llmgw_guarded = True
    kombu_redis.Channel._connparams = guarded


_survive_a_lost_redis()
