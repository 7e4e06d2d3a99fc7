"""The canary's share of requests (docs/operations.md, "Canaries"): the split itself, as
a table, and on a real web process with two engines."""

import collections
import time
import types

import pytest

from fleet.gateway import choice, prefix, table
from fleet.models import EngineProfile, Model
from tests.factories import inference_key, ready_model
from tests.gateway.live import post

ASK = {"model": "qwen", "messages": [{"role": "user", "content": "hi"}]}


def route_with(percent: int, active: int = 2, canary: int = 1) -> table.Route:
    ups = [table.Upstream(f"a{i}", "qwen", f"http://10.0.0.{i}:8000", "qwen", "default")
           for i in range(active)]  # fmt: skip
    ups += [table.Upstream(f"c{i}", "qwen", f"http://10.0.1.{i}:8000", "qwen", "fp8", canary=True)
            for i in range(canary)]  # fmt: skip
    return table.Route(1, "qwen", 0, ups, canary_percent=percent)


@pytest.mark.parametrize("percent", [1, 10, 25, 50, 90])
def test_the_canary_gets_its_share_within_two_points_over_10000_requests(percent):
    route = route_with(percent)
    gw = types.SimpleNamespace(limits=None)

    seen = collections.Counter(choice.choose(gw, route, None, [])[0].canary for _ in range(10_000))

    assert abs(seen[True] / 100 - percent) <= 2, seen


def test_with_prefix_routing_a_prompt_stays_on_its_side():
    route = route_with(25)
    gw = types.SimpleNamespace(limits=None)
    for i in range(200):
        at = prefix.key_of(
            "chat/completions", {"messages": [{"role": "user", "content": f"p{i}"}]}, 512
        )
        sides = {choice.choose(gw, route, at, [])[0].canary for _ in range(5)}
        assert sides == {at % 100 < 25}


def test_a_side_with_no_replica_left_gives_way_to_the_other():
    only_canary = route_with(10, active=0, canary=1)
    only_active = route_with(90, active=1, canary=0)
    gw = types.SimpleNamespace(limits=None)

    assert all(choice.choose(gw, only_canary, None, [])[0].canary for _ in range(50))
    assert not any(choice.choose(gw, only_active, None, [])[0].canary for _ in range(50))


@pytest.mark.live
@pytest.mark.django_db(transaction=True)
def test_a_canary_at_25_percent_serves_its_share_through_a_web_process(gateway_server, upstreams):
    import urllib.request

    active, fp8 = upstreams("active"), upstreams("fp8")
    model, (replica, canary_replica) = ready_model("qwen", [active, fp8])
    new = EngineProfile.objects.create(
        model=model, name="fp8", engine="fake", model_path="/models/fp8"
    )
    canary_replica.profile = new
    canary_replica.save()
    Model.objects.filter(pk=model.pk).update(canary_profile=new, canary_percent=25)
    _, secret = inference_key()

    statuses = [post(gateway_server, "/v1/chat/completions", ASK, secret)[0] for _ in range(400)]

    assert statuses == [200] * 400
    assert 0.19 <= fp8.served / 400 <= 0.31, (active.served, fp8.served)
    text = urllib.request.urlopen(gateway_server.url + "/metrics").read().decode()
    assert (
        f'llmgw_gateway_profile_requests_total{{model="qwen",profile="fp8",status="200"}} '
        f"{float(fp8.served)}" in text
    )


@pytest.mark.live
@pytest.mark.django_db(transaction=True)
def test_a_canary_answering_500_a_third_of_the_time_is_rolled_back_by_itself(
    gateway_server, upstreams
):
    from fleet.models import Event
    from tests.gateway.live import wait_until
    from tests.reconciler.helpers import Clock

    active, flaky = upstreams("active"), upstreams("fp8", mode="status500_third")
    model, (_, canary_replica) = ready_model("qwen", [active, flaky])
    new = EngineProfile.objects.create(
        model=model, name="fp8", engine="fake", model_path="/models/fp8"
    )
    canary_replica.profile = new
    canary_replica.save()
    Model.objects.filter(pk=model.pk).update(
        active_profile=EngineProfile.objects.get(model=model, name="default"),
        canary_profile=new,
        canary_percent=50,
        canary_max_error_rate=0.05,
        canary_min_requests=30,
    )
    _, secret = inference_key()

    statuses, first_bad = collections.Counter(), None
    for _ in range(120):
        status = post(gateway_server, "/v1/chat/completions", ASK, secret)[0]
        statuses[status] += 1
        if status == 500 and first_bad is None:
            first_bad = time.monotonic()

    # the gateway reports its figures every second; the next reconciler pass judges them
    def rolled_back():
        Clock().pass_()
        return Model.objects.get(pk=model.pk).canary_profile_id is None

    wait_until(rolled_back, timeout=15, what="the canary rolled back")
    print(f"\nrolled back {time.monotonic() - first_bad:.1f} s after the first bad answer")

    (event,) = Event.objects.filter(kind="canary", model=model)
    assert event.reason.startswith("canary 'fp8' aborted by the system: error rate 3")
    assert "past its bound of 5.0%" in event.reason
    # every request the active profile took was answered: none of the failures are its
    assert active.served == len(active.requests) and statuses[500] == len(flaky.requests) // 3
    assert statuses[200] + statuses[500] == 120
