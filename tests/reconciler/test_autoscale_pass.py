"""The autoscaler inside reconciler passes: gateways' reports in (real Redis), replicas and
events out. Time is passed in as ``now``; nothing sleeps."""

from datetime import timedelta

import pytest

from fleet.models import Event, Model
from fleet.services.autoscaler import load
from tests.factories import add_model, add_node
from tests.reconciler.helpers import Clock, make_ready, replicas, running

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def no_reports():
    load.forget()
    yield
    load.forget()


def autoscaled(name="qwen", replicas=1, **fields):
    model = add_model(name, replicas=replicas)
    for k, v in {"min_replicas": 1, "max_replicas": 3, **fields}.items():
        setattr(model, k, v)
    model.full_clean()
    model.save()
    return model


def gateway_reports(clock, source="gw-1", **models):
    """A gateway process's report at the clock's time: model=(in flight, waiting, last request)."""
    load.write(source, {name: list(v) for name, v in models.items()}, now=clock.now.timestamp())


def test_a_model_scaled_to_zero_starts_for_waiting_requests_and_records_why():
    # given: a node, and a model at zero that may scale to zero
    add_node("gpu-01")
    model = autoscaled(replicas=0, min_replicas=0, scale_to_zero_after_s=60)
    clock = Clock()
    clock.pass_()
    assert running(model) == []

    # when: a gateway reports 3 requests waiting for it
    gateway_reports(clock, qwen=(0, 3, clock.now.timestamp()))
    report = clock.pass_()

    # then: the same pass sets one replica and places it, and says why
    model.refresh_from_db()
    assert (report.scaled, model.desired_replicas, model.waiting_requests) == (1, 1, 3)
    assert len(running(model)) == 1
    (event,) = Event.objects.filter(model=model)
    assert (event.direction, event.from_replicas, event.to_replicas) == ("up", 0, 1)
    assert "3 request(s) waiting" in event.reason


def test_no_request_for_the_idle_time_scales_to_zero_and_keeps_the_last_request_time():
    add_node("gpu-01")
    model = autoscaled(min_replicas=0, scale_to_zero_after_s=300)
    clock = Clock()
    clock.pass_()
    make_ready(model)
    clock.pass_()
    # given: a request at the start, nothing since
    gateway_reports(clock, qwen=(0, 0, clock.now.timestamp()))
    clock.pass_()

    # when: 295 s pass without a request, then 10 s more
    clock.now += timedelta(seconds=295)
    gateway_reports(clock, qwen=(0, 0, (clock.now - timedelta(seconds=295)).timestamp()))
    assert clock.pass_().scaled == 0
    clock.now += timedelta(seconds=10)
    report = clock.pass_()

    # then: scaled to zero, its replica drained; the reason names the idle time
    model.refresh_from_db()
    assert (report.scaled, model.desired_replicas) == (1, 0)
    assert [r.state for r in replicas(model)] == ["draining"]
    event = Event.objects.get(model=model)
    assert "no request for 305 s" in event.reason
    assert model.last_request_at is not None


def test_load_steps_up_then_down_only_after_the_cool_down(settings):
    settings.LLMGW = {**settings.LLMGW, "AUTOSCALE_DOWN_COOLDOWN_S": 60.0}
    add_node("gpu-01")  # eight GPUs
    model = autoscaled(target_outstanding=2)
    clock = Clock()
    clock.pass_()
    make_ready(model)
    clock.pass_()

    # when: 6 requests in flight on one replica (two gateway processes)
    gateway_reports(clock, "gw-1", qwen=(4, 0, clock.now.timestamp()))
    gateway_reports(clock, "gw-2", qwen=(2, 0, clock.now.timestamp()))
    clock.pass_()
    model.refresh_from_db()
    assert model.desired_replicas == 3
    make_ready(model)
    clock.pass_()

    # then: the load gone, it holds 3 through the cool-down, then steps down one at a time
    clock.now += timedelta(seconds=30)
    gateway_reports(clock, "gw-1", qwen=(0, 0, clock.now.timestamp()))
    gateway_reports(clock, "gw-2", qwen=(0, 0, clock.now.timestamp()))
    assert clock.pass_().scaled == 0
    clock.now += timedelta(seconds=31)
    gateway_reports(clock, "gw-1", qwen=(0, 0, clock.now.timestamp()))
    assert clock.pass_().scaled == 1
    model.refresh_from_db()
    assert model.desired_replicas == 2
    steps = list(Event.objects.filter(model=model).order_by("created_at"))
    assert [(e.from_replicas, e.to_replicas) for e in steps] == [(1, 3), (3, 2)]


def test_without_autoscaling_a_model_is_left_as_it_is():
    add_node("gpu-01")
    model = add_model(replicas=1)
    clock = Clock()
    gateway_reports(clock, qwen=(50, 0, clock.now.timestamp()))
    clock.pass_()
    assert Model.objects.get(pk=model.pk).desired_replicas == 1
    assert not Event.objects.exists()


BOUNDS_1_2 = {"min_replicas": 1, "max_replicas": 2}
BOUNDS_0_0 = {"min_replicas": 0, "max_replicas": 0}


@pytest.mark.parametrize(
    "fields, field, message",
    [
        ({"min_replicas": 1}, "max_replicas", "together"),
        ({"min_replicas": 3, "max_replicas": 2}, "min_replicas", "above max_replicas 2"),
        ({"min_replicas": 0, "max_replicas": 2}, "scale_to_zero_after_s", "needs"),
        ({**BOUNDS_1_2, "scale_to_zero_after_s": 60}, "scale_to_zero_after_s", "min_replicas 0"),
        ({**BOUNDS_0_0, "scale_to_zero_after_s": 60}, "max_replicas", "at least 1"),
        ({"target_outstanding": 0}, "target_outstanding", "above 0"),
        ({"max_waiting": 0}, "max_waiting", "at least 1"),
    ],
)  # fmt: skip
def test_bad_bounds_are_refused_naming_the_field(fields, field, message):
    from django.core.exceptions import ValidationError

    model = Model(name="m", **fields)
    with pytest.raises(ValidationError) as exc:
        model.full_clean()
    assert message in " ".join(exc.value.message_dict[field])
