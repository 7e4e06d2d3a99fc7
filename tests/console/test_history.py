"""The history kept from heartbeats: one point per step, bounded, and never in a heartbeat's way."""

from datetime import timedelta

import pytest
import redis

from fleet.models import NodeLoad
from fleet.services import history
from tests.factories import add_node, report_load

pytestmark = pytest.mark.django_db


def test_one_point_per_step_and_an_hour_at_most(settings):
    settings.LLMGW = {**settings.LLMGW, "HISTORY_STEP_S": 600.0}
    add_node("gpu-01")
    # Heartbeats every 100 s for two hours (arrivals oldest first).
    for i in range(72):
        report_load("gpu-01", age=timedelta(seconds=7200 - 100 * i))

    kept = history._redis().llen(history.node_key("gpu-01"))
    recent = history.node_points("gpu-01", since=0)

    # One per 600 s: 12 over two hours, trimmed to an hour's (6) and the edge.
    assert kept == history.points_kept() == 7
    assert len(recent) == 7
    times = [p["t"] for p in recent]
    assert all(b - a >= 600 for a, b in zip(times, times[1:], strict=False))


@pytest.fixture
def redis_away():
    """The history's Redis connection pointed at nothing, until the test ends."""
    alive = history._redis()
    history._client = redis.Redis.from_url(
        "unix:///nonexistent/redis.sock", socket_timeout=0.2, socket_connect_timeout=0.2
    )
    yield
    history._client = alive


def test_redis_away_costs_a_heartbeat_nothing_but_its_point(redis_away):
    add_node("gpu-01")

    report_load("gpu-01", cpu_percent=55.0)

    assert NodeLoad.objects.get(node_id="gpu-01").cpu_percent == 55.0
    # And the next batch does not try again at once.
    assert history._paused()


class _Upstream:
    replica_id = "r1"
    outstanding = 2  # in flight through this gateway
    engine_waiting = 3  # waiting inside the engine, as it exports it


class _Route:
    name = "bench-model"
    upstreams = (_Upstream(),)


class _Gateway:
    routes = {"bench-model": _Route()}
    waiting = {}  # requests waiting for a replica, per model

    def upstreams_in_service(self):
        yield "bench-model", _Route.upstreams[0]


def test_what_a_gateway_records_is_what_its_metrics_count():
    from fleet.gateway import metrics

    before = metrics.model_figures(lambda: [_Gateway()])["bench-model"]
    metrics.REQUESTS.labels("bench-model", "", "200").inc(5)
    metrics.LATENCY.labels("bench-model").observe(0.5)
    metrics.RouteMetrics("bench-model").tokens({"prompt_tokens": 7, "completion_tokens": 12})

    figures = metrics.model_figures(lambda: [_Gateway()])["bench-model"]
    depth, requests, lat_sum, lat_count, tokens = figures

    assert depth == 5
    assert requests == before[1] + 5
    assert (lat_sum, lat_count) == (before[2] + 0.5, before[3] + 1)
    assert tokens == before[4] + 12, "completion tokens, not the prompt's"
