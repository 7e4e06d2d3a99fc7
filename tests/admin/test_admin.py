"""The Django admin as an operator uses it: pages, read-only facts, actions, secrets."""

import re
from datetime import timedelta

import pytest
from django.apps import apps
from django.contrib import admin
from django.contrib.admin.utils import quote
from django.contrib.auth.models import Group
from django.contrib.messages import get_messages
from django.urls import reverse
from django.utils import timezone

from fleet.models import (
    Adapter,
    ApiKey,
    ApiKeyScope,
    Batch,
    BatchFile,
    BatchLine,
    CostHour,
    EngineProfile,
    FleetStatus,
    JoinToken,
    KeyUsage,
    LocalWeights,
    Model,
    Node,
    NodeCredential,
    Shard,
    Team,
)
from fleet.models.access import hash_secret
from fleet.services import access, catalog, costs
from fleet.services.autoscaler import step as autoscale_step
from fleet.services.weights_gc import inventory as weights_inventory
from tests.admin.helpers import form_data
from tests.factories import (
    LLAMACPP_CPU,
    add_model,
    add_node,
    add_replica,
    bearer,
    enrol_node,
    operator,
    report_load,
    staff_user,
)

pytestmark = pytest.mark.django_db

FLEET_MODELS = [m for m in apps.get_app_config("fleet").get_models()]


@pytest.fixture(autouse=True)
def _fast_passwords(settings):
    # Users here log in with force_login; hashing their passwords slowly buys nothing.
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


def url(model, view, *args):
    # Quoted as the admin quotes its own links: a batch's id "batch_23..." is not "#...".
    return reverse(f"admin:fleet_{model._meta.model_name}_{view}", args=[quote(a) for a in args])


@pytest.fixture
def fleet():
    """One of everything, made through the paths that make them in production."""
    enrol_node("gpu-01")
    node = add_node("gpu-01", as_reported=True)
    add_node(
        "cpu-01",
        as_reported=True,
        gpus=[],
        fabrics=[],
        memory_total_mb=None,
        provision=[{"engine": "llamacpp", "version": "0.3.16", "state": "installed"}],
    )
    model = add_model("qwen-7b", **LLAMACPP_CPU)
    research = Team.objects.create(
        name="research", group=Group.objects.create(name="research"), max_gpus=8
    )
    Model.objects.filter(pk=model.pk).update(team=research)
    replica = add_replica(model, model.active_profile, ["gpu-01"])
    # A node's load counts only for shards it holds.
    shard = replica.shards.get()
    # A LoRA adapter of it, which the replica's engine reports it holds.
    Adapter.objects.create(name="qwen-7b-sql", model=model, source="/models/sql.gguf")
    Shard.objects.filter(pk=shard.pk).update(
        adapters=[{"name": "qwen-7b-sql", "state": "loaded", "error": "", "id": 0}]
    )
    report_load("gpu-01", shards=[{"shard_id": shard.pk, "cpu_cores": 1.5, "rss_bytes": 2**33}])
    access.create_join_token("rack-4", ttl=timedelta(hours=1))
    key, _ = ApiKey.issue(name="client", scope=ApiKeyScope.INFERENCE)
    KeyUsage.objects.create(
        key=key,
        model="qwen",
        hour=timezone.now().replace(minute=0, second=0, microsecond=0),
        requests=2,
        prompt_tokens=30,
        completion_tokens=40,
    )
    FleetStatus.get()
    catalog.apply("engines:\n  llamacpp: 0.3.36\n")
    # An operator asks for cpu-01's unused weights to go: a proposal and its event.
    weights_inventory.request_removal(
        LocalWeights.objects.filter(node_id="cpu-01").values_list("pk", flat=True)
    )
    # The autoscaler brings a target set above its bounds back inside: a decision
    # and its event.
    auto = add_model("auto", replicas=3, engine="llamacpp", gpus_per_node=0)
    Model.objects.filter(pk=auto.pk).update(min_replicas=1, max_replicas=2)
    autoscale_step.step(Model.objects.filter(pk=auto.pk), {}, timezone.now())
    # A batch of the client's, one line of it answered (the Batch API's rows).
    source = BatchFile.objects.create(
        api_key=key, purpose="batch", filename="in.jsonl", size_bytes=10, lines=2
    )
    batch = Batch.objects.create(
        api_key=key, input_file=source, endpoint="/v1/chat/completions", total=2,
        expires_at=timezone.now() + timedelta(hours=24),
    )  # fmt: skip
    BatchLine.objects.create(batch=batch, line=1, custom_id="q-1", status_code=200, body="{}")
    # A price, and an hour the accrual counted at it.
    costs.set_price("H100", "2.50", "EUR", timezone.now() - timedelta(days=1))
    CostHour.objects.create(
        hour=timezone.now().replace(minute=0, second=0, microsecond=0), model_name="qwen",
        gpu_class="NVIDIA H100 80GB HBM3", gpu_seconds=1800, cost=1.25, currency="EUR",
    )  # fmt: skip
    return node


def test_every_fleet_model_is_in_the_admin():
    missing = [m.__name__ for m in FLEET_MODELS if m not in admin.site._registry]
    assert missing == []


@pytest.mark.parametrize("model", FLEET_MODELS, ids=lambda m: m.__name__)
def test_changelist_and_change_view_render(admin_client, fleet, model):
    obj = model.objects.first()
    assert obj is not None, f"the fixture made no {model.__name__}"

    listing = admin_client.get(url(model, "changelist"))
    detail = admin_client.get(url(model, "change", obj.pk))

    assert listing.status_code == 200
    assert detail.status_code == 200
    assert str(obj) in detail.content.decode()


def test_node_page_shows_gpus_shards_and_load(admin_client, fleet):
    page = admin_client.get(url(Node, "change", "gpu-01")).content.decode()

    assert page.count("NVIDIA H100 80GB HBM3") == 8
    assert "GPU-5f1c8a2e-0007-4b7d-9e2a-3c6f0d1b0007" in page
    assert "mlx5_0" in page  # fabric
    assert "/models/qwen" in page  # weights
    assert "3.50 / 3.00 / 2.50" in page  # load averages
    assert "412.0" in page  # memory used, GB


def test_agent_reported_fields_are_read_only(admin_client, fleet):
    # given the change form as a browser would post it back
    page = admin_client.get(url(Node, "change", "gpu-01")).content.decode()
    data = form_data(page)
    assert "hostname" not in data and "memory_total_mb" not in data and "state" not in data
    # when an operator cordons it, and a crafted post tries to rewrite reported facts
    data.update(
        cordoned="on",
        operator_labels='{"pool": "batch"}',
        hostname="evil.example",
        memory_total_mb="1",
        state="lost",
    )
    resp = admin_client.post(url(Node, "change", "gpu-01"), data)

    # then only the operator's intent changed
    assert resp.status_code == 302, resp.content.decode()[:2000]
    node = Node.objects.get(pk="gpu-01")
    assert node.cordoned and node.operator_labels == {"pool": "batch"}
    assert node.hostname == "gpu-01.example"
    assert node.memory_total_mb == 2063500 and node.state == "ready"


def test_draining_from_the_form_also_cordons(admin_client, fleet):
    data = form_data(admin_client.get(url(Node, "change", "gpu-01")).content.decode())
    data.pop("cordoned", None)
    data["draining"] = "on"

    resp = admin_client.post(url(Node, "change", "gpu-01"), data)

    assert resp.status_code == 302, resp.content.decode()[:2000]
    node = Node.objects.get(pk="gpu-01")
    assert node.draining and node.cordoned


def test_operator_labels_must_be_an_object(admin_client, fleet):
    data = form_data(admin_client.get(url(Node, "change", "gpu-01")).content.decode())
    data["operator_labels"] = '["zone", "a"]'

    resp = admin_client.post(url(Node, "change", "gpu-01"), data)

    assert resp.status_code == 200
    assert "labels must be an object" in resp.content.decode()
    assert Node.objects.get(pk="gpu-01").operator_labels == {}


def test_observed_facts_cannot_be_added_or_edited(admin_client, fleet):
    gpu = fleet.gpus.first()
    assert admin_client.get(url(Node, "add")).status_code == 403
    assert admin_client.get(url(type(gpu), "add")).status_code == 403
    page = admin_client.get(url(type(gpu), "change", gpu.pk)).content.decode()
    assert 'name="memory_used_mb"' not in page


def test_node_list_shows_dash_for_unknown_memory_and_stale_load(admin_client, fleet):
    report_load("cpu-01", cpu_percent=88.0, age=timedelta(minutes=2))

    page = admin_client.get(url(Node, "changelist")).content.decode()

    # One table row each: the match may not run across a row's end.
    def row(node_id):
        return re.search(rf"<tr[^>]*>(?:(?!</tr>).)*?{node_id}.*?</tr>", page, re.S).group(0)

    gpu_row, cpu_row = row("gpu-01"), row("cpu-01")
    assert "2063.5" in gpu_row and "8×H100" in gpu_row and ">38<" in gpu_row
    assert '<td class="field-memory">-</td>' in cpu_row
    assert '<td class="field-cpu_percent">-</td>' in cpu_row  # two minutes old
    assert not re.search(r">\s*88", cpu_row)  # the stale figure is shown nowhere


def _action(client, action, *ids):
    return client.post(
        url(Node, "changelist"), {"action": action, "_selected_action": list(ids)}, follow=True
    )


def test_cordon_and_uncordon_actions(admin_client, fleet):
    resp = _action(admin_client, "cordon_nodes", "gpu-01", "cpu-01")
    assert [str(m) for m in get_messages(resp.wsgi_request)] == ["cordoned 2 nodes"]
    assert Node.objects.filter(cordoned=True).count() == 2

    Node.objects.filter(pk="cpu-01").update(cordoned=False)
    resp = _action(admin_client, "uncordon_nodes", "gpu-01", "cpu-01")

    assert [str(m) for m in get_messages(resp.wsgi_request)] == [
        "uncordoned 1 node (1 were not cordoned)"
    ]
    assert not Node.objects.filter(cordoned=True).exists()


def test_revoke_credentials_action(admin_client, fleet):
    assert NodeCredential.objects.filter(node_id="gpu-01", revoked_at__isnull=True).exists()

    _action(admin_client, "revoke_credentials", "gpu-01")

    assert not NodeCredential.objects.filter(node_id="gpu-01", revoked_at__isnull=True).exists()


def test_join_token_secret_is_shown_once_and_stored_hashed(admin_client):
    resp = admin_client.post(
        url(JoinToken, "add"), {"name": "rack-4", "lifetime": "2h", "max_uses": "3"}
    )

    assert resp.status_code == 200
    assert "no-store" in resp["Cache-Control"]
    secret = re.search(r"lgj_[0-9a-f]{8}_[A-Za-z0-9_-]{43}", resp.content.decode()).group(0)
    token = JoinToken.objects.get()
    assert token.name == "rack-4" and token.max_uses == 3 and token.uses == 0
    assert token.secret_hash == hash_secret(secret)
    assert timedelta(minutes=119) < token.expires_at - token.created_at <= timedelta(hours=2)
    assert secret not in str(JoinToken.objects.values().get())
    # the secret travels in no cookie (messages) and never appears again
    assert not any(secret in c.value for c in resp.cookies.values())
    for page in (url(JoinToken, "change", token.pk), url(JoinToken, "changelist")):
        assert secret not in admin_client.get(page).content.decode()
    # and it enrols a node
    assert access.identify(secret).join_token_id == token.pk


def test_join_token_with_a_bad_lifetime_creates_nothing(admin_client):
    resp = admin_client.post(
        url(JoinToken, "add"), {"name": "rack-4", "lifetime": "forever", "max_uses": "1"}
    )

    assert resp.status_code == 200
    assert "&#x27;forever&#x27; is not a positive duration" in resp.content.decode()
    assert not JoinToken.objects.exists()


def test_api_key_secret_is_shown_once_and_works(admin_client, client):
    ops = operator()
    resp = admin_client.post(
        url(ApiKey, "add"), {"name": "ci", "scope": "manage", "user": str(ops.pk)}
    )

    secret = re.search(r"lgk_[0-9a-f]{8}_[A-Za-z0-9_-]{43}", resp.content.decode()).group(0)
    key = ApiKey.objects.get(name="ci")
    assert key.secret_hash == hash_secret(secret) and key.user == ops
    assert client.get("/api/v1/nodes/", **bearer(secret)).status_code == 200


def test_manage_key_for_a_non_staff_user_is_refused(admin_client):
    clerk = staff_user("clerk", is_staff=False)

    resp = admin_client.post(
        url(ApiKey, "add"), {"name": "ci", "scope": "manage", "user": str(clerk.pk)}
    )

    assert resp.status_code == 200
    assert "user &#x27;clerk&#x27; is not an active staff user" in resp.content.decode()
    assert not ApiKey.objects.exists()


def test_profile_rules_hold_in_the_admin(admin_client):
    model = Model.objects.create(name="llama-70b")

    resp = admin_client.post(
        url(EngineProfile, "add"),
        {
            "model": str(model.pk),
            "name": "tp4",
            "engine": "vllm",
            "tp": "4",
            "pp": "1",
            "gpus_per_node": "8",
            "nodes": "1",
            "args": "[]",
            "env": "{}",
            "model_path": "meta-llama/Llama-3.1-70B",
            "startup_timeout_s": "1800",
        },
    )

    assert resp.status_code == 200
    assert "must equal gpus_per_node × nodes (8 × 1 = 8)" in resp.content.decode()
    assert not EngineProfile.objects.exists()


def test_secrets_filter_by_status(admin_client, fleet):
    revoked, _ = access.create_join_token("old", ttl=timedelta(hours=1))
    access.revoke_join_token(revoked)

    def names(status):
        page = admin_client.get(url(JoinToken, "changelist") + f"?status={status}")
        return sorted(
            re.findall(r'<th class="field-name"><a [^>]*>([^<]+)</a>', page.content.decode())
        )

    assert names("revoked") == ["old"]
    assert names("usable") == ["rack-4"]
    assert names("expired") == ["test"]  # used up by enrolling gpu-01
    page = admin_client.get(url(NodeCredential, "changelist") + "?status=revoked")
    assert page.status_code == 200 and "0 node credentials" in page.content.decode()


def test_a_node_not_keeping_up_shows_in_the_list_and_on_its_page(admin_client, fleet):
    Node.objects.filter(pk="gpu-01").update(
        connected=True,
        desired_version=5,
        acked_version=3,
        desired_lag_since=timezone.now() - timedelta(seconds=90),
    )

    listing = admin_client.get(url(Node, "changelist")).content.decode()
    page = admin_client.get(url(Node, "change", "gpu-01")).content.decode()

    assert "not keeping up: v3 of v5" in listing
    assert "not keeping up: v3 of v5" in page
    # a node caught up shows its version, nothing alarming
    assert "not keeping up" not in admin_client.get(url(Node, "change", "cpu-01")).content.decode()


def test_prefix_routing_is_switched_on_in_the_model_form_and_filtered_in_the_list(admin_client):
    chat = add_model("chat", **LLAMACPP_CPU)
    add_model("batch", **LLAMACPP_CPU)
    page = admin_client.get(url(Model, "change", chat.pk)).content.decode()
    assert "Prefix-aware routing" in page
    data = form_data(page)
    assert "prefix_routing" not in data  # an unticked box: off, the default

    # when: the operator ticks it and saves
    resp = admin_client.post(url(Model, "change", chat.pk), {**data, "prefix_routing": "on"})

    # then: the model routes by prefix, and the list can show just those that do
    assert resp.status_code == 302, resp.content.decode()[:2000]
    assert Model.objects.get(pk=chat.pk).prefix_routing is True
    listing = admin_client.get(url(Model, "changelist") + "?prefix_routing__exact=1")
    names = re.findall(r'class="field-name"><a [^>]*>([^<]+)<', listing.content.decode())
    assert names == ["chat"]
