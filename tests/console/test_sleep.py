"""Sleep on the console (docs/operations.md, "Sleep and wake"): a replica asleep, how long,
the host memory it holds, on the cluster, node and model pages; the model's policy."""

import re
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from fleet.models import (
    DesiredState,
    EngineProfile,
    Model,
    Replica,
    ReplicaState,
    Shard,
    ShardState,
)
from fleet.services.autoscaler.status import asleep_text, sleep_policy, sleep_status
from fleet.services.estimate import estimate_key
from tests.factories import add_model, add_node, add_replica, operator

pytestmark = pytest.mark.django_db

CLUSTER = reverse("console:cluster")


def weights_16_gb(profile) -> dict:
    """An estimate of the profile's model (current: made from its inputs) of 16 GB of
    weights."""
    return {"key": estimate_key(profile), "total_bytes": 18 * 10**9, "weights_bytes": 16 * 10**9}


def text(html: str, element_id: str) -> str:
    """The text of the element with this id, its markup taken out."""
    m = re.search(rf'<(\w+)[^>]*\bid="{element_id}"[^>]*>(.*?)</\1>', html, re.S)
    assert m, f"no #{element_id}"
    return re.sub(r"<[^>]+>", "", m.group(2)).strip()


def row(html: str, css: str, key: str, value: str) -> str:
    """The text of the table row ``tr.css[key=value]``, its markup taken out."""
    m = re.search(rf'<tr class="{css}[^"]*" {key}="{re.escape(value)}">(.*?)</tr>', html, re.S)
    assert m, f"no {css} row {value}"
    # Spaces only: "4\xa0minutes" keeps its no-break space, as the page has it.
    return re.sub(r"[ \t\r\n]+", " ", re.sub(r"<[^>]+>", " ", m.group(1))).strip()


def put_to_sleep(replica: Replica, ago: timedelta, *, level: int = 1) -> Replica:
    """The replica and its shards asleep since ``ago``, as the reconciler and the node
    leave them."""
    since = timezone.now() - ago
    Replica.objects.filter(pk=replica.pk).update(
        state=ReplicaState.ASLEEP,
        state_changed_at=since,
        reason="asleep: no request for 300 s (sleep after 300 s)",
    )
    for shard in replica.shards.all():
        shard.state, shard.desired_state = ShardState.ASLEEP, DesiredState.ASLEEP
        shard.state_changed_at = since
        shard.spec = {**shard.spec, "sleep_level": level}
        shard.save()
    return Replica.objects.get(pk=replica.pk)


@pytest.fixture
def sleepy():
    """gpu-01 with two models: qwen asleep for 4 minutes on GPU 0, holding its 16 GB of
    weights in host memory, and chat awake on GPU 1."""
    add_node("gpu-01")
    model = add_model("qwen")
    EngineProfile.objects.filter(pk=model.active_profile_id).update(
        estimate=weights_16_gb(model.active_profile)
    )
    Model.objects.filter(pk=model.pk).update(sleep_after_s=300, sleep_level=1)
    model = Model.objects.get(pk=model.pk)
    replica = add_replica(model, model.active_profile, ["gpu-01"])
    Shard.objects.filter(replica=replica).update(gpu_uuids=["GPU-gpu-01-0"])
    put_to_sleep(replica, timedelta(minutes=4, seconds=10))
    chat = add_model("chat")
    awake = add_replica(chat, chat.active_profile, ["gpu-01"])
    Shard.objects.filter(replica=awake).update(gpu_uuids=["GPU-gpu-01-1"], port=8100)
    return model


# ---- the words, without a database ------------------------------------------------------

NOW = timezone.now()


@pytest.mark.parametrize(
    ("since", "host_mb", "says"),
    [
        (NOW - timedelta(minutes=4), 16000, "asleep 4\xa0minutes · holds 16 GB of host memory"),
        (NOW - timedelta(hours=2, minutes=5), 15500, "asleep 2\xa0hours · holds 15.5 GB of host"),
        (NOW - timedelta(seconds=20), 0, "asleep 0\xa0minutes · holds no host memory"),
        (None, 16000, "asleep · holds 16 GB of host memory"),
        (NOW, None, "going to sleep"),
    ],
    ids=["level 1", "hours", "weights dropped", "since unknown", "not asleep yet"],
)
def test_asleep_text(since, host_mb, says):
    assert asleep_text(since, host_mb, NOW).startswith(says)


@pytest.mark.parametrize(
    ("fields", "asleep", "policy", "status"),
    [
        ({}, 0, "", ""),
        ({"sleep_after_s": 60}, 0, "after 60 s idle, level 1", "after 60 s idle, level 1"),
        (
            {"sleep_after_s": 60, "sleep_level": 2, "stop_after_asleep_s": 3600},
            2,
            "after 60 s idle, level 2, to zero after 3600 s asleep",
            "2 asleep; after 60 s idle, level 2, to zero after 3600 s asleep",
        ),
        ({}, 1, "", "1 asleep; sleep is off: they wake"),
    ],
    ids=["never", "sleeps", "asleep and stops", "turned off"],
)
def test_sleep_policy_and_status(fields, asleep, policy, status):
    model = Model(name="m", **fields)
    assert sleep_policy(model) == policy
    assert sleep_status(model, asleep) == status


# ---- the pages --------------------------------------------------------------------------


def test_the_model_page_shows_its_policy_and_each_replica_asleep(client, sleepy):
    client.force_login(operator())

    for name in ("model", "model-fragment"):
        html = client.get(reverse(f"console:{name}", args=[sleepy.pk])).content.decode()

        assert text(html, "model-sleep") == "after 300 s idle, level 1"
        assert 'title="level 1: weights kept in host memory (fast wake)"' in html
        (replica,) = Replica.objects.filter(model=sleepy)
        line = row(html, "replica-row", "data-replica-id", replica.pk)
        assert "asleep asleep 4\xa0minutes · holds 16 GB of host memory" in line
        assert "asleep: no request for 300 s (sleep after 300 s)" in line
        assert "(told asleep)" in line
        assert re.search(r'data-replicas="asleep">asleep <b>1</b>', html)


def test_a_model_that_never_sleeps_says_so(client, sleepy):
    client.force_login(operator())
    chat = Model.objects.get(name="chat")

    html = client.get(reverse("console:model", args=[chat.pk])).content.decode()

    assert text(html, "model-sleep") == "never"
    assert 'class="asleep"' not in html


def test_a_replica_told_to_sleep_is_going_to_sleep_until_its_node_says_so(client, sleepy):
    client.force_login(operator())
    Shard.objects.filter(replica__model=sleepy).update(state=ShardState.READY)

    html = client.get(reverse("console:model", args=[sleepy.pk])).content.decode()

    (replica,) = Replica.objects.filter(model=sleepy)
    assert "asleep going to sleep" in row(html, "replica-row", "data-replica-id", replica.pk)


def test_the_cluster_page_lists_asleep_replicas_and_frees_their_gpus(client, sleepy):
    client.force_login(operator())
    (replica,) = Replica.objects.filter(model=sleepy)

    for url in (CLUSTER, reverse("console:cluster-fragment")):
        html = client.get(url).content.decode()

        line = row(html, "asleep-row", "data-replica-id", replica.pk)
        assert line == f"{replica.pk} qwen gpu-01 asleep 4\xa0minutes · holds 16 GB of host memory"
        assert re.search(r'data-replicas="asleep">asleep <b>1</b>', html)
        # the models' asleep column, before their scaling
        assert row(html, "model-row", "data-model", "qwen").split()[-2] == "1"
        assert row(html, "model-row", "data-model", "chat").split()[-2] == "0"
        # the node line counts its shard asleep; its GPU is free for others
        assert "1/2 (1 asleep)" in row(html, "node-row", "data-node-id", "gpu-01")
        assert re.search(r'data-total="gpus-used">1<', html)
        assert "qwen asleep" in html  # GPU 0's title: who sleeps on it


def test_the_cluster_page_has_no_asleep_table_when_nothing_sleeps(client):
    add_model("chat")
    client.force_login(operator())

    html = client.get(CLUSTER).content.decode()

    assert 'id="cluster-asleep"' not in html
    assert row(html, "model-row", "data-model", "chat").split()[-2] == "0"


def test_the_asleep_table_reads_in_the_same_queries_for_one_or_many(client, sleepy):
    client.force_login(operator())

    def queries() -> int:
        with CaptureQueriesContext(connection) as ctx:
            assert client.get(CLUSTER).status_code == 200
        return len(ctx.captured_queries)

    one = queries()
    for i in range(5):
        more = add_model(f"more-{i}")
        put_to_sleep(add_replica(more, more.active_profile, ["gpu-01"]), timedelta(seconds=i))

    assert queries() == one
    assert client.get(CLUSTER).content.decode().count('class="asleep-row"') == 6


def test_the_node_page_shows_each_shard_asleep_and_what_they_hold(client, sleepy):
    client.force_login(operator())
    (shard,) = Shard.objects.filter(replica__model=sleepy)

    html = client.get(reverse("console:node", args=["gpu-01"])).content.decode()

    assert text(html, "node-asleep") == "1 shard asleep holds 16 GB of host memory"
    line = row(html, "shard-row", "data-shard-id", shard.pk)
    assert "asleep asleep 4\xa0minutes · holds 16 GB of host memory" in line
    # who is on each GPU: the one asleep holds none of it
    assert "qwen asleep" in row(html, "gpu-row", "data-gpu-index", "0")
    assert "chat (whole)" in row(html, "gpu-row", "data-gpu-index", "1")


def test_a_shard_asleep_at_level_2_holds_no_host_memory(client, sleepy):
    client.force_login(operator())
    (replica,) = Replica.objects.filter(model=sleepy)
    put_to_sleep(replica, timedelta(minutes=1), level=2)

    html = client.get(reverse("console:node", args=["gpu-01"])).content.decode()

    assert text(html, "node-asleep") == "1 shard asleep, holding no host memory"
    assert "asleep 1\xa0minute · holds no host memory" in html


def test_a_node_without_shards_asleep_says_nothing_of_sleep(client):
    add_node("gpu-01")
    chat = add_model("chat")
    add_replica(chat, chat.active_profile, ["gpu-01"])
    client.force_login(operator())

    html = client.get(reverse("console:node", args=["gpu-01"])).content.decode()

    assert 'id="node-asleep"' not in html
    assert 'class="asleep"' not in html
