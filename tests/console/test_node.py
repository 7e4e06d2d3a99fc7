"""A node's page: its figures now, its shards, actions with a confirmation, charts and logs."""

import asyncio
import json
import re
import threading
import urllib.parse
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from asgiref.sync import async_to_sync
from channels.layers import DEFAULT_CHANNEL_LAYER, channel_layers
from django.urls import reverse

from fleet.models import Node, NodeCredential
from fleet.services import doorbells
from tests.factories import (
    add_model,
    add_node,
    add_replica,
    enrol_node,
    grant,
    operator,
    report_load,
    staff_user,
)

pytestmark = pytest.mark.django_db


def node_url(name="node", *args, node_id="gpu-01"):
    return reverse(f"console:{name}", args=[node_id, *args])


@pytest.fixture
def busy_node():
    """gpu-01 with a qwen shard on it and a load that measures that shard."""
    add_node("gpu-01", as_reported=True)
    model = add_model("qwen")
    replica = add_replica(model, model.active_profile, ["gpu-01"])
    shard = replica.shards.get()
    report_load(
        "gpu-01",
        cpu_percent=40.0,
        shards=[{"shard_id": shard.pk, "cpu_cores": 3.25, "rss_bytes": 6 * 2**30}],
    )
    return shard


def test_the_page_shows_the_node_now_and_each_shard(client, busy_node):
    client.force_login(operator())

    html = client.get(node_url()).content.decode()

    assert 'id="node-summary"' in html
    assert "40% of 224" in html
    assert 'id="node-load">3.50 / 3.00 / 2.50<' in html
    assert "/var/lib/llmgw" in html  # a disk, with its bar
    assert 'class="bar disk' in html
    shard = html[html.index(f'data-shard-id="{busy_node.pk}"') :]
    assert 'class="shard-cores">3.25<' in shard
    assert 'class="shard-memory">6.0 GiB<' in shard
    assert "<td>30000</td>" in shard or "<td>8000</td>" in shard  # its port
    assert 'id="node-charts"' in html and 'id="node-logs"' in html
    assert client.get(node_url("node-fragment")).status_code == 200


def test_an_unknown_node_is_404(client):
    client.force_login(operator())
    assert client.get(node_url(node_id="nope")).status_code == 404
    assert client.get(node_url("node-charts", node_id="nope")).status_code == 404


@pytest.mark.parametrize(
    "action, field, value",
    [("cordon", "cordoned", True), ("drain", "draining", True)],
)
def test_an_action_asks_first_then_does_it(client, action, field, value):
    add_node("gpu-01")
    client.force_login(operator())

    confirm = client.get(node_url("node-action", action))
    assert confirm.status_code == 200
    assert f'id="confirm-{action}"' in confirm.content.decode()
    assert getattr(Node.objects.get(pk="gpu-01"), field) is not value  # asking changed nothing

    done = client.post(node_url("node-action", action))
    assert done.url == node_url()
    assert getattr(Node.objects.get(pk="gpu-01"), field) is value


def test_uncordon_ends_a_drain(client):
    add_node("gpu-01")
    Node.objects.filter(pk="gpu-01").update(cordoned=True, draining=True)
    client.force_login(operator())

    client.post(node_url("node-action", "uncordon"))

    node = Node.objects.get(pk="gpu-01")
    assert not node.cordoned and not node.draining


def test_revoke_revokes_the_nodes_credentials(client):
    enrol_node("gpu-01")
    add_node("gpu-01")
    client.force_login(operator())

    client.post(node_url("node-action", "revoke"))

    assert not NodeCredential.objects.filter(node_id="gpu-01", revoked_at__isnull=True).exists()


def test_actions_need_their_permissions_and_csrf(client):
    add_node("gpu-01")
    viewer = grant(staff_user("viewer"), "fleet.view_node")
    client.force_login(viewer)

    page = client.get(node_url()).content.decode()
    assert 'id="action-cordon"' not in page and 'id="action-revoke"' not in page
    assert client.get(node_url("node-action", "cordon")).status_code == 403
    assert client.post(node_url("node-action", "revoke")).status_code == 403
    assert not Node.objects.get(pk="gpu-01").cordoned

    # An operator's POST without the CSRF token is refused too.
    from django.test import Client

    strict = Client(enforce_csrf_checks=True)
    strict.force_login(operator("ops2"))
    assert strict.post(node_url("node-action", "cordon")).status_code == 403
    assert not Node.objects.get(pk="gpu-01").cordoned


def test_the_vllm_build_is_shown_and_set_on_the_page_telling_the_node(client, monkeypatch):
    from fleet.models import EngineInstall
    from fleet.services import engines as engine_service

    add_node("gpu-01")
    EngineInstall.objects.create(
        node_id="gpu-01", engine="vllm", version="0.11.2", variant="cu129", state="installed",
        detail="auto: cu13 failed here (the GPU check exited with 1); fell back to cu129",
    )  # fmt: skip
    told = []
    monkeypatch.setattr(engine_service, "tell_nodes", lambda ids: told.extend(ids))
    client.force_login(operator())

    page = client.get(node_url()).content.decode()
    assert "vLLM build: <b>auto</b>" in page
    assert '<td class="engine-variant">cu129</td>' in page and "fell back to cu129" in page
    assert 'id="action-vllm-build-cu13"' in page
    assert '<b class="current-build" id="current-vllm-build">auto (now)</b>' in page
    confirm = client.get(node_url("node-action", "vllm-build-cu13")).content.decode()
    assert "installs vLLM&#x27;s CUDA 13 build (needs driver 580 or newer)" in confirm
    assert Node.objects.get(pk="gpu-01").vllm_build == "auto"  # asking changed nothing

    client.post(node_url("node-action", "vllm-build-cu13"))

    assert Node.objects.get(pk="gpu-01").vllm_build == "cu13"
    assert told == ["gpu-01"]  # at once, as the admin's form and actions do


def test_only_change_node_sets_the_build(client):
    add_node("gpu-01")
    drainer = grant(staff_user("drainer"), "fleet.view_node", "fleet.drain_node")
    client.force_login(drainer)

    page = client.get(node_url()).content.decode()
    assert 'id="action-cordon"' in page and 'id="action-vllm-build-none"' not in page
    assert client.post(node_url("node-action", "vllm-build-none")).status_code == 403
    assert Node.objects.get(pk="gpu-01").vllm_build == "auto"


def test_charts_and_logs_refuse_anonymous_and_non_staff_users(client):
    add_node("gpu-01")
    for user in (None, staff_user("guest", is_staff=False)):
        if user:
            client.force_login(user)
        for name in ("node-charts", "node-logs", "node-fragment"):
            assert client.get(node_url(name)).status_code == 403, (name, user)


# ---- charts ----------------------------------------------------------------------------


def test_charts_from_the_history_kept_from_heartbeats(client, busy_node):
    # given: one more heartbeat at the same moment as the fixture's (no point of
    # its own: within a step), then two a step or more apart
    report_load("gpu-01", cpu_percent=80.0)
    for later_s in (20, 40):
        report_load(
            "gpu-01",
            cpu_percent=50.0,
            age=timedelta(seconds=-later_s),
            shards=[{"shard_id": busy_node.pk, "cpu_cores": 2.0, "rss_bytes": 2**30}],
        )
    client.force_login(operator())

    html = client.get(node_url("node-charts")).content.decode()

    assert 'data-source="history"' in html
    assert 'id="chart-cpu" data-chart="cpu" data-points="3"' in html
    assert 'id="chart-load" data-chart="load" data-points="9"' in html
    assert 'data-chart="model-cores" data-points="3"' in html
    assert 'data-series="qwen"' in html  # per model, by the shard's model
    assert "<svg" in html and "<polyline" in html


class _Prometheus(BaseHTTPRequestHandler):
    queries: list = []

    def do_GET(self):
        url = urllib.parse.urlsplit(self.path)
        params = urllib.parse.parse_qs(url.query)
        query = params["query"][0]
        type(self).queries.append(query)
        start, end = float(params["start"][0]), float(params["end"][0])
        if url.path != "/api/v1/query_range":
            self.send_error(404)
            return
        if "by (model)" in query:
            labels = [{"model": "qwen"}]
        elif "llmgw_node_load" in query:
            labels = [{"node": "gpu-01", "window": w} for w in ("1m", "5m", "15m")]
        else:
            labels = [{"node": "gpu-01"}]
        values = [[start + i * (end - start) / 4, str(10 + i)] for i in range(5)]
        body = json.dumps(
            {
                "status": "success",
                "data": {
                    "resultType": "matrix",
                    "result": [{"metric": m, "values": values} for m in labels],
                },
            }
        ).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def prometheus(settings):
    _Prometheus.queries = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Prometheus)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    settings.LLMGW = {**settings.LLMGW, "PROMETHEUS_URL": f"http://127.0.0.1:{server.server_port}"}
    yield _Prometheus
    server.shutdown()
    server.server_close()


def test_charts_from_prometheus_when_one_is_configured(client, busy_node, prometheus):
    client.force_login(operator())

    html = client.get(node_url("node-charts")).content.decode()

    assert 'data-source="prometheus"' in html
    assert 'id="chart-cpu" data-chart="cpu" data-points="5"' in html
    assert 'id="chart-load" data-chart="load" data-points="15"' in html
    assert 'data-chart="queue" data-points="5"' in html
    assert 'llmgw_node_cpu_utilization_percent{node="gpu-01"}' in prometheus.queries
    assert 'sum(llmgw_gateway_queue_depth{model="qwen"})' in prometheus.queries


def test_a_prometheus_that_does_not_answer_is_said_not_a_broken_page(client, settings):
    add_node("gpu-01")
    settings.LLMGW = {**settings.LLMGW, "PROMETHEUS_URL": "http://127.0.0.1:9"}
    client.force_login(operator())

    resp = client.get(node_url("node-charts"))

    assert resp.status_code == 200
    assert "Prometheus at http://127.0.0.1:9 did not answer" in resp.content.decode()


# ---- logs ------------------------------------------------------------------------------


def test_a_node_without_a_socket_is_answered_at_once(client, settings):
    add_node("gpu-01")
    Node.objects.filter(pk="gpu-01").update(connected=False, channel_name="")
    # Waiting would take ten minutes: the answer comes without asking the node.
    settings.LLMGW = {**settings.LLMGW, "LOGS_TIMEOUT_S": 600.0}
    client.force_login(operator())

    html = client.get(node_url("node-logs")).content.decode()

    assert "no agent connected" in html
    assert 'data-kind="disconnected"' in html


def test_a_silent_agent_is_said_to_be_maybe_older(client, settings):
    add_node("gpu-01")
    Node.objects.filter(pk="gpu-01").update(connected=True, channel_name="specific.nobody")
    settings.LLMGW = {**settings.LLMGW, "LOGS_TIMEOUT_S": 0.2}
    client.force_login(operator())

    html = client.get(node_url("node-logs") + "?source=agent").content.decode()

    assert "did not answer within 0.2 s" in html
    assert "the agent may be older than the control plane" in html


def _answer_one_logs_request(node_id: str, lines: list[str], ready: threading.Event):
    """Stand in for the node's socket: take its logs request, answer it."""

    async def serve():
        # A layer of its own: the page's view receives on the shared one.
        layer = channel_layers.make_backend(DEFAULT_CHANNEL_LAYER)
        channel = await layer.new_channel()
        await layer.group_add(doorbells.node_group(node_id), channel)
        ready.set()
        msg = await asyncio.wait_for(layer.receive(channel), 10)
        reply = {"type": "logs_reply", "v": 1, "request_id": msg["request_id"], "lines": lines}
        reply["sources"] = ["agent"]
        await layer.send(
            msg["reply_channel"],
            {"type": "logs.reply", "request_id": msg["request_id"], "reply": reply},
        )

    async_to_sync(serve)()


def test_the_logs_panel_shows_what_the_agent_answers(client):
    add_node("gpu-01")
    Node.objects.filter(pk="gpu-01").update(connected=True, channel_name="specific.x")
    ready = threading.Event()
    agent = threading.Thread(
        target=_answer_one_logs_request,
        args=("gpu-01", ["engine up", "<script>alert(1)</script>"], ready),
    )
    agent.start()
    ready.wait(10)
    client.force_login(operator())

    html = client.get(node_url("node-logs") + "?source=agent&lines=50").content.decode()
    agent.join(10)

    assert 'id="node-logs-lines"' in html
    assert "engine up" in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert "<script>alert" not in html


def test_the_admins_view_on_site_opens_the_console_pages(client):
    add_node("gpu-01")
    model = add_model("qwen")
    client.force_login(operator())

    for admin_page, console_page in (
        (reverse("admin:fleet_node_change", args=["gpu-01"]), node_url()),
        (
            reverse("admin:fleet_model_change", args=[model.pk]),
            reverse("console:model", args=[model.pk]),
        ),
    ):
        html = client.get(admin_page).content.decode()
        link = re.search(r'href="([^"]+)" class="viewsitelink"', html).group(1)
        assert urllib.parse.urlsplit(client.get(link).url).path == console_page


def _queries(client, url) -> int:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    with CaptureQueriesContext(connection) as ctx:
        assert client.get(url).status_code == 200
    return len(ctx.captured_queries)


def test_node_and_model_pages_do_not_query_per_shard(client):
    add_node("gpu-01")
    model = add_model("qwen")
    client.force_login(operator())
    add_replica(model, model.active_profile, ["gpu-01"])
    few = [
        _queries(client, url)
        for url in (node_url(), node_url("node-fragment"), node_url("node-charts"))
    ]
    few.append(_queries(client, reverse("console:model", args=[model.pk])))

    for _ in range(9):
        add_replica(model, model.active_profile, ["gpu-01"])
    many = [
        _queries(client, url)
        for url in (node_url(), node_url("node-fragment"), node_url("node-charts"))
    ]
    many.append(_queries(client, reverse("console:model", args=[model.pk])))

    assert few == many


def test_each_gpu_says_which_shards_it_holds_and_what_is_promised_of_it(client):
    from fleet.models import GPU, Shard

    # given two models sharing GPU 0 of an H100 node and one holding GPU 1 whole
    add_node("gpu-01")
    gpu0, gpu1 = (GPU.objects.get(node_id="gpu-01", index=i).uuid for i in (0, 1))
    for name, budget, uuid in (("qwen", 30, gpu0), ("llama", 20.5, gpu0), ("big", None, gpu1)):
        model = add_model(name, engine="vllm", gpu_memory_gb=budget)
        replica = add_replica(model, model.active_profile, ["gpu-01"])
        Shard.objects.filter(replica=replica).update(gpu_uuids=[uuid])
    client.force_login(operator())

    html = client.get(node_url()).content.decode()

    rows = dict(re.findall(r'data-gpu-index="(\d+)".*?class="gpu-use">([^<]*)<', html, re.S))
    assert rows["0"] == "llama 20.5 GB, qwen 30 GB; 50.5 of 79.6 GB promised"
    assert rows["1"] == "big (whole)"
    assert rows["2"] == "-"
