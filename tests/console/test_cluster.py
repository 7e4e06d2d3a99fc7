"""The cluster page: totals, a row per node with its bars, pending replicas, refreshed in place."""

import re

import pytest
from django.contrib.auth.models import Group
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from fleet.models import FleetStatus, Model, Node, ReplicaState, Team
from tests.console.helpers import simulated_fleet
from tests.factories import add_model, add_node, add_replica, operator, report_load, staff_user

pytestmark = pytest.mark.django_db

CLUSTER = reverse("console:cluster")
FRAGMENT = reverse("console:cluster-fragment")


def row(html: str, node_id: str) -> str:
    m = re.search(
        rf'<tr class="node-row[^"]*" data-node-id="{re.escape(node_id)}">(.*?)</tr>', html, re.S
    )
    assert m, f"no row for {node_id}"
    return m.group(1)


def test_each_node_has_a_row_with_its_bars_and_a_link_to_its_page(client):
    # given: a node with a fresh load, and one that never said its memory
    add_node("gpu-01", as_reported=True)
    report_load("gpu-01", cpu_percent=62.0)
    add_node("cpu-02", gpus=[], memory_gb=None)
    client.force_login(operator())

    # when
    html = client.get(CLUSTER).content.decode()

    # then
    gpu = row(html, "gpu-01")
    assert 'class="bar cpu level-low" data-percent="62.0"' in gpu
    assert "62% of 224" in gpu
    assert "412.0 GiB / 2.0 TiB" in gpu  # used of MemTotal
    assert gpu.count('class="bar gpu') == 8
    assert "llamacpp 0.3.16" in gpu
    assert reverse("console:node", args=["gpu-01"]) in gpu
    cpu = row(html, "cpu-02")
    # Unknown is not zero: no load and no memory read "-", with an empty bar.
    assert 'class="bar ram level-unknown" data-percent=""' in cpu
    assert '<span class="label">-</span>' in cpu
    assert 'class="bar gpu' not in cpu


def test_totals_count_nodes_gpus_and_replicas_by_state(client):
    simulated_fleet(3, gpus=2)
    Node.objects.filter(pk="node-00001").update(cordoned=True, state="suspect")
    client.force_login(operator())

    html = client.get(FRAGMENT).content.decode()

    assert re.search(r'data-state="ready">ready <b>2</b>', html)
    assert re.search(r'data-state="suspect">suspect <b>1</b>', html)
    assert '<b data-total="cordoned">1</b>' in html
    # Six GPUs, one held by each node's ready shard.
    assert '<b data-total="gpus-used">3</b>' in html
    assert '<b data-total="gpus-free">3</b>' in html
    assert re.search(r'data-replicas="ready">ready <b>3</b>', html)
    assert re.search(r'data-replicas="pending">pending <b>1</b>', html)


def test_pending_replicas_say_why(client):
    model = add_model("big", replicas=1)
    model.replicas.create(
        profile=model.active_profile,
        state=ReplicaState.PENDING,
        reason="no node fits: gpu-07: has 8 GB of memory, needs 24",
    )
    client.force_login(operator())

    html = client.get(CLUSTER).content.decode()

    models = html[html.index('id="cluster-models"') : html.index('id="cluster-pending"')]
    assert '<td class="model-ready">0 / 1</td><td>1</td>' in models
    pending = html[html.index('id="cluster-pending"') :]
    assert "gpu-07: has 8 GB of memory, needs 24" in pending
    assert reverse("console:model", args=[model.pk]) in pending


def test_the_outage_banner_is_on_the_page_once_and_in_what_refreshes(client):
    FleetStatus.objects.create(
        pk=1,
        replacement_paused=True,
        message="3 of 4 nodes are silent",
        last_pass_at=timezone.now(),
    )
    client.force_login(operator())

    page = client.get(CLUSTER).content.decode()
    fragment = client.get(FRAGMENT).content.decode()

    # In the refreshed body, and not again above it.
    assert page.count("replacement paused: 3 of 4 nodes are silent") == 1
    assert "replacement paused: 3 of 4 nodes are silent" in fragment


def test_a_reconciler_that_never_ran_is_said(client):
    client.force_login(operator())
    assert "the reconciler has never run" in client.get(FRAGMENT).content.decode()


def test_the_page_refreshes_its_body_from_the_fragment(client):
    add_node("gpu-01")
    client.force_login(operator())

    html = client.get(CLUSTER + "?state=ready&q=gpu").content.decode()

    assert 'id="cluster-body" data-refresh-url="' + FRAGMENT + "?state=ready&amp;q=gpu" in html
    assert "fleet/console.js" in html
    fragment = client.get(FRAGMENT + "?state=ready&q=gpu").content.decode()
    assert 'data-node-id="gpu-01"' in fragment
    assert "<html" not in fragment


def test_filter_and_pages(client):
    simulated_fleet(120, gpus=0)
    client.force_login(operator())

    first = client.get(CLUSTER).content.decode()
    second = client.get(CLUSTER + "?page=2").content.decode()
    found = client.get(CLUSTER + "?q=node-00077").content.decode()

    assert first.count('class="node-row') == 100
    assert "page 1 of 2 (120 nodes)" in first
    assert second.count('class="node-row') == 20
    assert found.count('class="node-row') == 1


def _queries(client, url) -> int:
    with CaptureQueriesContext(connection) as ctx:
        assert client.get(url).status_code == 200
    return len(ctx.captured_queries)


@pytest.mark.parametrize("with_teams", [False, True], ids=["no teams", "teams"])
def test_the_queries_do_not_grow_with_the_fleet(client, with_teams):
    client.force_login(operator())
    simulated_fleet(10, prefix="small")
    if with_teams:  # the Teams table: its use counted from every shard of its models
        research = Team.objects.create(name="research", group=Group.objects.create(name="r"))
        Model.objects.update(team=research)
    small = (_queries(client, CLUSTER), _queries(client, FRAGMENT))

    simulated_fleet(90, prefix="more")  # 100 nodes in all, 800 GPUs, 100 shards
    Model.objects.filter(team=None).update(team=Team.objects.first())
    large = (_queries(client, CLUSTER), _queries(client, FRAGMENT))

    assert small == large
    print(f"cluster page queries: page {large[0]}, fragment {large[1]}")
    # One for the teams; three more for what they hold when there are some.
    assert large[0] <= (20 if with_teams else 17), large


def test_the_teams_table_shows_use_against_quotas(client):
    client.force_login(operator())
    simulated_fleet(3, prefix="n")  # one ready shard per node, a GPU each
    group = Group.objects.create(name="research")
    research = Team.objects.create(name="research", group=group, max_gpus=8, max_replicas=3)
    operator("alice").groups.add(group)
    Model.objects.update(team=research)
    Team.objects.create(name="vision", group=Group.objects.create(name="vision"))

    page = client.get(CLUSTER).content.decode()

    row = re.search(r'<tr class="team-row" data-team="research">.*?</tr>', page).group(0)
    assert '<td class="team-gpus">3 of 8</td>' in row
    assert '<td class="team-replicas">3 of 3</td>' in row
    assert '<td class="team-memory">238.9</td>' in row  # three H100s, no memory quota
    assert "<td>1</td>" in row  # its member
    assert 'data-team="vision"' in page


def test_anonymous_and_non_staff_users_are_refused(client):
    add_node("gpu-01")
    # The page sends them to the login; what scripts fetch answers 403.
    assert client.get(CLUSTER).status_code == 302
    assert client.get(FRAGMENT).status_code == 403
    client.force_login(staff_user("guest", is_staff=False))
    assert client.get(CLUSTER).status_code == 302
    assert client.get(FRAGMENT).status_code == 403


def test_the_admin_index_and_the_root_lead_to_the_cluster_page(client):
    client.force_login(operator())
    index = client.get(reverse("admin:index")).content.decode()
    assert f'id="cluster-link"><a href="{CLUSTER}"' in index
    assert f'id="nav-cluster" href="{CLUSTER}"' in index
    assert client.get("/").url == CLUSTER


def test_staff_without_the_view_permission_are_refused(client):
    from tests.factories import grant

    add_node("gpu-01")
    model = add_model("qwen")
    client.force_login(staff_user("guest"))  # staff, no fleet permission

    assert client.get(CLUSTER).status_code == 403
    assert client.get(FRAGMENT).status_code == 403
    assert client.get(reverse("console:node-charts", args=["gpu-01"])).status_code == 403
    assert client.get(reverse("console:node-logs", args=["gpu-01"])).status_code == 403
    assert client.get(reverse("console:model", args=[model.pk])).status_code == 403
    assert client.get(reverse("console:model-fragment", args=[model.pk])).status_code == 403
    assert 'id="nav-cluster"' not in client.get(reverse("admin:index")).content.decode()

    client.force_login(grant(staff_user("viewer"), "fleet.view_node", "fleet.view_model"))
    assert client.get(CLUSTER).status_code == 200
    assert client.get(FRAGMENT).status_code == 200
    assert client.get(reverse("console:model", args=[model.pk])).status_code == 200


def test_a_gpu_s_bar_names_the_shards_on_it(client):
    from fleet.models import GPU, Shard

    add_node("gpu-01")
    gpu0 = GPU.objects.get(node_id="gpu-01", index=0).uuid
    for name in ("qwen", "llama"):
        model = add_model(name, engine="vllm", gpu_memory_gb=30)
        replica = add_replica(model, model.active_profile, ["gpu-01"])
        Shard.objects.filter(replica=replica).update(gpu_uuids=[gpu0])
    client.force_login(operator())

    html = client.get(CLUSTER).content.decode()

    bar = html[html.index('data-gpu-index="0"') :]
    assert "; llama 30 GB, qwen 30 GB; 60.0 of 79.6 GB promised" in bar[: bar.index(">")]


def test_each_row_says_the_nodes_vllm_build_and_what_it_installed(client):
    from fleet.models import EngineInstall

    add_node("gpu-01")
    add_node("gpu-02")
    Node.objects.filter(pk="gpu-02").update(vllm_build="none")
    EngineInstall.objects.create(
        node_id="gpu-01", engine="vllm", version="0.11.2", variant="cu129", state="installing"
    )
    client.force_login(operator())

    html = client.get(CLUSTER).content.decode()

    one = row(html, "gpu-01")
    assert (
        '<td class="node-vllm-build">auto <i class="vllm-installed">(cu129 installing)</i>' in one
    )
    assert "vllm 0.11.2 cu129 <i>installing</i>" in one
    assert '<td class="node-vllm-build">none</td>' in row(html, "gpu-02")
