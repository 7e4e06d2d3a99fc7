"""Management commands as an operator types them."""

import io
import re
from datetime import timedelta

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone

from fleet.models import ApiKey, EngineInstall, JoinToken, Node, NodeCredential, ShardState
from fleet.models.access import hash_secret
from fleet.services import access
from tests.factories import (
    LLAMACPP_CPU,
    add_model,
    add_node,
    add_replica,
    bearer,
    enrol_node,
    grant,
    report_load,
)

pytestmark = pytest.mark.django_db


def run(*args) -> tuple[str, str]:
    out, err = io.StringIO(), io.StringIO()
    call_command(*args, stdout=out, stderr=err)
    return out.getvalue(), err.getvalue()


def table(text: str) -> dict[str, dict[str, str]]:
    """The `nodes` table by node id and column, split where the header's columns start."""
    lines = text.splitlines()
    header = lines[0]
    starts = [m.start() for m in re.finditer(r"(?:(?<=  )|^)\S", header)]
    bounds = list(zip(starts, [*starts[1:], None], strict=True))
    names = [header[a:b].strip() for a, b in bounds]
    rows = {}
    for line in lines[1:]:
        cells = [line[a:b].strip() for a, b in bounds]
        rows[cells[0]] = dict(zip(names, cells, strict=True))
    return rows


# --- nodes -----------------------------------------------------------------------


def test_nodes_table():
    add_node("gpu-01", engine_versions={"vllm": "0.11.0", "llamacpp": "0.3.16"}, as_reported=True)
    add_node("old-01", gpus=[], memory_total_mb=None, engine_versions={}, as_reported=True)
    add_node(
        "mixed-01",
        as_reported=True,
        memory_total_mb=512 * 1024,
        gpus=[
            {"index": 0, "uuid": "GPU-a", "name": "NVIDIA A100-SXM4-80GB"},
            {"index": 1, "uuid": "GPU-b", "name": "NVIDIA A100-SXM4-80GB"},
            {"index": 2, "uuid": "GPU-c", "name": "NVIDIA L4"},
        ],
    )
    report_load("gpu-01", cpu_percent=41.6)
    report_load("old-01", cpu_percent=99.0, age=timedelta(minutes=3))
    Node.objects.filter(pk="mixed-01").update(cordoned=True)
    Node.objects.filter(pk="gpu-01").update(vllm_build="cu129")
    EngineInstall.objects.create(
        node_id="gpu-01", engine="llamacpp", version="0.3.16", variant="cuda", state="installed"
    )
    EngineInstall.objects.create(
        node_id="gpu-01",
        engine="vllm",
        version="0.11.2",
        variant="cu129",
        state="installing",
        detail="downloading",
        progress_percent=42,
    )
    model = add_model("qwen-7b", **LLAMACPP_CPU)
    profile = model.active_profile
    add_replica(model, profile, ["gpu-01"])
    add_replica(model, profile, ["gpu-01"], state=ShardState.LOADING)

    out, _ = run("nodes")
    rows = table(out)

    assert out.splitlines()[0].split("  ")[0] == "NODE"
    assert rows["gpu-01"] == {
        "NODE": "gpu-01",
        "STATE": "ready",
        "CPU %": "42",
        "MEM (GB)": "2063.5",
        "GPUS": "8×H100",
        "ENGINES": "llamacpp,vllm",
        "SHARDS (READY/ALL)": "1/2",
        "VLLM BUILD": "cu129",
        "INSTALLS": (
            "llamacpp 0.3.16 cuda installed; vllm 0.11.2 cu129 installing (downloading, 42 %)"
        ),
    }
    assert rows["old-01"]["VLLM BUILD"] == "auto"
    assert rows["old-01"]["INSTALLS"] == "-"
    # unknown memory is '-', never 0; a three-minute-old load is not shown
    assert rows["old-01"]["MEM (GB)"] == "-"
    assert rows["old-01"]["CPU %"] == "-"
    assert rows["old-01"]["GPUS"] == "-"
    assert rows["old-01"]["ENGINES"] == "-"
    assert rows["mixed-01"]["GPUS"] == "2×A100+1×L4"
    assert rows["mixed-01"]["STATE"] == "ready,cordoned"
    assert rows["mixed-01"]["MEM (GB)"] == "524.2"


def test_nodes_on_an_empty_fleet_says_how_to_start():
    out, _ = run("nodes")
    assert "no nodes yet" in out and "create_join_token" in out


# --- join tokens -----------------------------------------------------------------


def test_create_join_token_prints_the_secret_once():
    out, err = run("create_join_token", "rack-4", "--ttl", "2h", "--uses", "5")

    secret = out.strip()
    assert re.fullmatch(r"lgj_[0-9a-f]{8}_[A-Za-z0-9_-]{43}", secret)
    assert secret not in err and "shown only once" in err
    token = JoinToken.objects.get()
    assert (token.name, token.max_uses) == ("rack-4", 5)
    assert token.secret_hash == hash_secret(secret)
    assert timedelta(minutes=119) < token.expires_at - timezone.now() <= timedelta(hours=2)
    assert access.identify(secret).join_token_id == token.pk


@pytest.mark.parametrize(
    "args, words",
    [
        (["--ttl", "forever"], "'forever' is not a positive duration"),
        (["--ttl", "0h"], "'0h' is not a positive duration"),
        (["--uses", "0"], "max_uses must be at least 1 (got 0)"),
    ],
)
def test_create_join_token_bad_input(args, words):
    with pytest.raises(CommandError, match=re.escape(words)):
        run("create_join_token", "rack-4", *args)
    assert not JoinToken.objects.exists()


# --- revoke_node -----------------------------------------------------------------


def test_revoke_node_without_asking():
    enrol_node("gpu-01")

    out, _ = run("revoke_node", "gpu-01", "--no-input")

    assert out.strip() == "revoked 1 credential(s) of node 'gpu-01'"
    assert not NodeCredential.objects.filter(revoked_at__isnull=True).exists()


def test_revoke_node_asks_first(monkeypatch):
    enrol_node("gpu-01")
    answers = iter(["no", "yes"])
    prompts = []
    monkeypatch.setattr("builtins.input", lambda p: prompts.append(p) or next(answers))

    with pytest.raises(CommandError, match="revocation cancelled"):
        run("revoke_node", "gpu-01")
    assert NodeCredential.objects.filter(revoked_at__isnull=True).count() == 1

    run("revoke_node", "gpu-01")
    assert "Revoke node 'gpu-01'?" in prompts[0]
    assert not NodeCredential.objects.filter(revoked_at__isnull=True).exists()


@pytest.mark.parametrize("command", ["revoke_node", "cordon", "uncordon"])
def test_unknown_node_is_named(command):
    add_node("gpu-01", as_reported=True)
    extra = ["--no-input"] if command == "revoke_node" else []
    with pytest.raises(CommandError, match="no node 'gpu-99'"):
        run(command, "gpu-99", *extra)
    assert not Node.objects.get(pk="gpu-01").cordoned


# --- cordon / uncordon -----------------------------------------------------------


def test_cordon_and_uncordon():
    add_node("gpu-01", as_reported=True)

    assert run("cordon", "gpu-01")[0].strip() == "node 'gpu-01' cordoned"
    assert Node.objects.get(pk="gpu-01").cordoned
    assert run("cordon", "gpu-01")[0].strip() == "node 'gpu-01' was already cordoned"
    assert run("uncordon", "gpu-01")[0].strip() == "node 'gpu-01' uncordoned"
    assert not Node.objects.get(pk="gpu-01").cordoned
    assert run("uncordon", "gpu-01")[0].strip() == "node 'gpu-01' was not cordoned"


# --- create_api_key --------------------------------------------------------------


def test_create_manage_key_works_against_the_api(client, django_user_model):
    grant(django_user_model.objects.create_user("ops", is_staff=True), "fleet.view_node")

    out, err = run("create_api_key", "ci", "--scope", "manage", "--user", "ops")

    secret = out.strip()
    assert "manage key 'ci'" in err and secret not in err
    assert ApiKey.objects.get().secret_hash == hash_secret(secret)
    assert client.get("/api/v1/nodes/", **bearer(secret)).status_code == 200


def test_create_inference_key_with_models_and_expiry():
    add_model("qwen-7b", **LLAMACPP_CPU)
    add_model("llama-8b", **LLAMACPP_CPU)

    run("create_api_key", "chat", "--models", "qwen-7b, llama-8b", "--expires", "30d")

    key = ApiKey.objects.get()
    assert key.scope == "inference" and key.allowed_models == ["llama-8b", "qwen-7b"]
    assert timedelta(days=29) < key.expires_at - timezone.now() <= timedelta(days=30)


@pytest.mark.parametrize(
    "args, words",
    [
        (["--scope", "manage"], "a manage key needs a user to act as"),
        (["--scope", "manage", "--user", "nobody"], "no user 'nobody'"),
        (["--scope", "manage", "--user", "clerk"], "user 'clerk' is not an active staff user"),
        (["--models", "qwen-7b,gpt-9"], "unknown model(s) or adapter(s): gpt-9"),
        (["--expires", "soon"], "'soon' is neither a duration"),
        (["--expires", "2001-01-01T00:00Z"], "is in the past"),
    ],
)
def test_create_api_key_bad_input(args, words, django_user_model):
    django_user_model.objects.create_user("clerk", is_staff=False)
    add_model("qwen-7b", **LLAMACPP_CPU)

    with pytest.raises(CommandError, match=re.escape(words)):
        run("create_api_key", "ci", *args)
    assert not ApiKey.objects.exists()
