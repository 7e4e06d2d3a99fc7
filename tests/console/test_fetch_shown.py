"""A shard fetching its weights shows the fetch (source, bytes, %) on the node and cluster
pages, in the admin and in the API, through the real fetch_progress service."""

import pytest
from django.urls import reverse

from agentd import protocol
from fleet.models import ShardState
from fleet.services import inventory
from tests.factories import add_model, add_node, add_replica, bearer, manage_key, operator

pytestmark = pytest.mark.django_db

URL = "https://mirror.example/models/qwen-q4.gguf"


@pytest.fixture
def fetching():
    add_node("gpu-01", as_reported=True)
    model = add_model("qwen")
    replica = add_replica(model, model.active_profile, ["gpu-01"], state=ShardState.STARTING)
    shard = replica.shards.get()
    inventory.apply_fetch_progress(
        "gpu-01",
        protocol.FetchProgress(
            type="fetch_progress",
            shard_id=shard.pk,
            source=URL,
            bytes_done=3 * 2**30,
            bytes_total=12 * 2**30,
        ),
    )
    return shard


WORDS = f"{URL}: 3.0 GiB of 12.0 GiB (25%)"


def test_the_node_and_cluster_pages_show_the_fetch(client, fetching):
    client.force_login(operator())

    node = client.get(reverse("console:node", args=["gpu-01"])).content.decode()
    row = node[node.index(f'data-shard-id="{fetching.pk}"') :]
    assert f'class="shard-fetch">{WORDS}<' in row

    cluster = client.get(reverse("console:cluster")).content.decode()
    assert 'class="node-fetch">fetching 1 shard: 3.0 GiB of 12.0 GiB (25%)<' in cluster


def test_a_loaded_shard_shows_no_fetch(client, fetching):
    type(fetching).objects.filter(pk=fetching.pk).update(state=ShardState.READY)
    client.force_login(operator())

    node = client.get(reverse("console:node", args=["gpu-01"])).content.decode()
    assert 'class="shard-fetch">-<' in node
    assert "node-fetch" not in client.get(reverse("console:cluster")).content.decode()


def test_the_admin_and_the_api_show_the_fetch(client, fetching):
    user = operator(is_superuser=True)
    client.force_login(user)
    admin = client.get(reverse("admin:fleet_shard_changelist")).content.decode()
    assert "3.0 GiB of 12.0 GiB (25%)" in admin

    _, secret = manage_key(user)
    client.defaults.update(bearer(secret))
    [shard] = client.get("/api/v1/shards/", {"node": "gpu-01"}).json()["results"]
    assert shard["fetch_source"] == URL
    assert (shard["fetch_bytes_done"], shard["fetch_bytes_total"]) == (3 * 2**30, 12 * 2**30)
    assert shard["fetch_percent"] == 25
