"""Which LoRA adapters each replica holds: the desired sets the nodes get, and the least
recently used making way for an adapter a gateway waits for (real Redis for the
gateways' reports, the reconciler's pass with its clock; nothing sleeps)."""

import pytest

from fleet.models import Adapter
from fleet.services import adapters, catalog
from fleet.services.autoscaler import load
from fleet.services.desired import desired_set as desired
from tests.factories import add_model, add_node
from tests.reconciler.helpers import Clock, make_ready, running

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def no_reports():
    load.forget()
    yield
    load.forget()


def held_by(node_id: str) -> list[list[str]]:
    """Per shard the node should run: the adapters it should hold, in order."""
    return [[a.name for a in s.adapters] for s in desired(node_id).shards]


def served(max_adapters: int, *names: str):
    add_node("gpu-01")
    model = add_model("qwen", max_adapters=max_adapters)
    for name in names:
        Adapter.objects.create(name=name, model=model, source=f"/lora/{name}.gguf")
    clock = Clock()
    clock.pass_()
    make_ready(model)
    return model, clock


def test_a_replica_holds_its_profiles_bound_never_asked_for_ones_by_name():
    model, _ = served(2, "qwen-sql", "qwen-chat", "qwen-poet")
    assert len(running(model)) == 1
    assert held_by("gpu-01") == [["qwen-chat", "qwen-poet"]]
    (spec,) = desired("gpu-01").shards
    assert spec.adapters[0].source == "/lora/qwen-chat.gguf"


def test_a_profile_without_adapters_holds_none_of_them():
    served(0, "qwen-sql")
    assert held_by("gpu-01") == [[]]


def test_one_a_gateway_waits_for_takes_the_least_recently_used_ones_place():
    model, clock = served(1, "qwen-chat", "qwen-sql")
    assert held_by("gpu-01") == [["qwen-chat"]]
    version = desired("gpu-01").version

    # when: a gateway reports a request waiting for qwen-sql, which no replica holds
    load.write("gw-1", {"qwen-sql": [0, 1, None]}, now=clock.now.timestamp())
    clock.pass_()

    # then: the replica's node is told to hold it instead, in a new desired version
    assert held_by("gpu-01") == [["qwen-sql"]]
    assert desired("gpu-01").version > version
    assert Adapter.objects.get(name="qwen-sql").last_request_at is not None

    # and a request for one it holds moves nothing
    clock.advance(5)
    version = desired("gpu-01").version
    load.write("gw-1", {"qwen-sql": [1, 0, clock.now.timestamp()]}, now=clock.now.timestamp())
    clock.pass_()
    assert held_by("gpu-01") == [["qwen-sql"]]
    assert desired("gpu-01").version == version


def test_the_order_is_most_recently_asked_for_first():
    model, _ = served(3)
    from datetime import timedelta

    from django.utils import timezone

    now = timezone.now()
    made = [
        Adapter.objects.create(name=n, model=model, source="/x.gguf", last_request_at=t)
        for n, t in (("a", now - timedelta(hours=1)), ("b", now), ("c", None), ("d", None))
    ]
    assert [a.name for a in adapters.wanted(made, 3)] == ["b", "a", "c"]


def test_a_catalog_file_declares_adapters_under_their_model_and_refuses_a_bad_one():
    add_model("qwen")
    text = """
models:
  - name: qwen
    adapters:
      - name: qwen-sql
        source: /lora/sql.gguf
        rank: 16
"""
    result = catalog.apply(text)
    assert "adapter qwen-sql created" in result.changes
    assert catalog.apply(text).changes == []
    with pytest.raises(catalog.CatalogError) as refused:
        catalog.apply(text.replace("rank: 16", "rank: 17").replace("qwen-sql", "qwen"))
    assert any("is a model's name" in e for e in refused.value.errors), refused.value.errors
    assert any("rank 17" in e for e in refused.value.errors), refused.value.errors
    assert list(Adapter.objects.values_list("name", "rank")) == [("qwen-sql", 16)]
