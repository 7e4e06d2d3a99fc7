"""A model's page: its replicas, where, why pending; the gateway's figures for it."""

import time

import pytest
from django.urls import reverse

from fleet.models import ReplicaState
from fleet.services import history
from tests.console.test_node import prometheus  # noqa: F401 - the fixture
from tests.factories import add_model, add_node, add_replica, operator

pytestmark = pytest.mark.django_db


@pytest.fixture
def qwen():
    add_node("gpu-01")
    model = add_model("qwen", replicas=2)
    add_replica(model, model.active_profile, ["gpu-01"])
    model.replicas.create(
        profile=model.active_profile,
        state=ReplicaState.PENDING,
        reason="no node fits: gpu-07: has 8 GB of memory, needs 24",
    )
    return model


def test_replicas_where_and_why(client, qwen):
    client.force_login(operator())

    html = client.get(reverse("console:model", args=[qwen.pk])).content.decode()

    assert 'data-replicas="ready">ready <b>1</b>' in html
    assert 'data-replicas="pending">pending <b>1</b>' in html
    assert reverse("console:node", args=["gpu-01"]) in html
    assert "gpu-07: has 8 GB of memory, needs 24" in html
    # The body refreshes itself in place from its fragment.
    fragment = reverse("console:model-fragment", args=[qwen.pk])
    assert f'id="model-body" data-refresh-url="{fragment}"' in html
    body = client.get(fragment).content.decode()
    assert 'data-replicas="pending">pending <b>1</b>' in body and "<html" not in body


def test_its_adapters_where_each_is_loaded_or_why_not_and_their_usage(client, qwen):
    from django.utils import timezone

    from fleet.models import Adapter, ApiKey, KeyUsage, Shard

    Adapter.objects.create(name="qwen-sql", model=qwen, source="/lora/sql.gguf")
    Adapter.objects.create(name="qwen-bad", model=qwen, source="/lora/bad.gguf")
    Shard.objects.filter(replica__model=qwen).update(
        adapters=[
            {"name": "qwen-sql", "state": "loaded", "error": "", "id": 0},
            {"name": "qwen-bad", "state": "failed", "error": "bad magic in file", "id": None},
        ]
    )
    key, _ = ApiKey.issue(name="client")
    hour = timezone.now().replace(minute=0, second=0, microsecond=0)
    KeyUsage.objects.create(
        key=key, model="qwen-sql", hour=hour, requests=3, prompt_tokens=10, completion_tokens=20
    )
    client.force_login(operator())

    html = client.get(reverse("console:model", args=[qwen.pk])).content.decode()

    sql = html.split('data-adapter="qwen-sql">')[1].split("</tr>")[0]
    assert "gpu-01 (replica" in sql and ": loaded" in sql
    assert "<td>3</td><td>30</td>" in sql
    bad = html.split('data-adapter="qwen-bad">')[1].split("</tr>")[0]
    assert ": failed" in bad and "bad magic in file" in bad


def test_gateway_figures_from_what_the_gateways_recorded(client, qwen):
    now = time.time()
    # One gateway process: 60 requests in the minute between its two points,
    # taking 3 s in all; 3 waiting at the end.
    history.record_gateway({"qwen": (2, 100, 5.0, 100, 1000)}, "gw:1", at=now - 60)
    history.record_gateway({"qwen": (3, 160, 8.0, 160, 1960)}, "gw:1", at=now)
    client.force_login(operator())

    html = client.get(reverse("console:model", args=[qwen.pk])).content.decode()

    assert 'id="model-rps">1.00<' in html
    assert 'id="model-latency">0.050 s<' in html
    assert 'id="model-queue">3<' in html
    assert 'id="model-tokens">960<' in html
    assert 'id="model-tokens-rate">16.0<' in html


def test_points_of_a_gateway_that_counted_no_tokens_still_give_rates(client, qwen):
    now = time.time()
    # Points written before the gateway counted tokens: six figures, no seventh.
    history.record_gateway({"qwen": (0, 10, 1.0, 10)}, "gw:old", at=now - 30)
    history.record_gateway({"qwen": (0, 40, 4.0, 40)}, "gw:old", at=now)
    client.force_login(operator())

    html = client.get(reverse("console:model", args=[qwen.pk])).content.decode()

    assert 'id="model-rps">1.00<' in html
    assert 'id="model-tokens">-<' in html


def test_gateway_figures_from_prometheus(client, qwen, prometheus):  # noqa: F811
    client.force_login(operator())

    html = client.get(reverse("console:model", args=[qwen.pk])).content.decode()

    assert 'id="model-rps">14.00<' in html  # the last point the fake Prometheus gave
    assert 'sum(rate(llmgw_gateway_requests_total{model="qwen"}[300s]))' in prometheus.queries
    assert (
        'sum(rate(llmgw_gateway_tokens_total{model="qwen",kind="completion"}[300s]))'
        in prometheus.queries
    )


def test_an_unknown_model_is_404_and_strangers_are_sent_to_log_in(client, qwen):
    url = reverse("console:model", args=[qwen.pk])
    assert client.get(url).status_code == 302
    client.force_login(operator())
    assert client.get(reverse("console:model", args=[qwen.pk + 100])).status_code == 404


def test_one_replica_is_drained_from_the_models_page_after_a_confirmation(client, qwen):
    from fleet.models import Replica
    from tests.factories import grant, staff_user

    ready = Replica.objects.get(model=qwen, state=ReplicaState.READY)
    page = reverse("console:model", args=[qwen.pk])
    drain = reverse("console:replica-action", args=[qwen.pk, ready.pk, "drain"])

    # a viewer sees the replicas but no way to take one out, and cannot post it
    viewer = grant(staff_user("viewer"), "fleet.view_model", "fleet.view_replica")
    client.force_login(viewer)
    assert drain not in client.get(page).content.decode()
    assert client.post(drain).status_code == 403
    ready.refresh_from_db()
    assert ready.evict == ""

    # an operator gets the button, a confirmation saying what happens, then the drain
    client.force_login(operator())
    html = client.get(page).content.decode()
    assert f'id="replica-{ready.pk}-drain" href="{drain}"' in html
    confirm = client.get(drain).content.decode()
    assert "a replacement is placed first" in confirm and 'id="confirm-drain"' in confirm
    ready.refresh_from_db()
    assert ready.evict == "", "asking changed nothing"

    done = client.post(drain)

    assert done.url == page
    ready.refresh_from_db()
    assert (ready.evict, ready.evict_by) == ("drain", "user 'ops'")
    html = client.get(page).content.decode()
    assert "(drain asked by user &#x27;ops&#x27;)" in html
    assert f'id="replica-{ready.pk}-drain"' not in html, "asked once"
    assert (
        client.get(reverse("console:replica-action", args=[qwen.pk, "nope", "drain"])).status_code
        == 404
    )


def test_the_page_says_when_a_canary_takes_a_share(client, qwen):
    from fleet.models import EngineProfile, Model

    fp8 = EngineProfile.objects.create(model=qwen, name="fp8", engine="fake", model_path="/m")
    Model.objects.filter(pk=qwen.pk).update(canary_profile=fp8, canary_percent=25)
    client.force_login(operator())

    html = client.get(reverse("console:model", args=[qwen.pk])).content.decode()

    assert "canary <b>fp8</b> at <b>25 %</b> of the requests, beside <b>default</b>" in html


def test_the_canarys_figures_stand_beside_the_active_profiles(client, qwen):
    from fleet.models import EngineProfile, Model
    from fleet.services import canary_figures
    from fleet.services.canary_figures import Tally

    fp8 = EngineProfile.objects.create(model=qwen, name="fp8", engine="fake", model_path="/m")
    Model.objects.filter(pk=qwen.pk).update(canary_profile=fp8, canary_percent=25)
    canary = Tally(40, 10)
    for _ in range(20):
        canary.first_token(0.7)
    counts = {("qwen", fp8.pk): {"fp8": canary, "default": Tally(120, 0)}}
    canary_figures.write("gw-1", canary_figures.encode(counts))
    client.force_login(operator())

    html = client.get(reverse("console:model", args=[qwen.pk])).content.decode()

    assert (
        '<tr data-profile="default"><td>default</td><td>120</td><td>0 %</td><td>-</td></tr>' in html
    )
    assert (
        '<tr data-profile="fp8"><td>fp8</td><td>40</td><td>25 %</td><td>≤ 1.0 s</td></tr>' in html
    )
