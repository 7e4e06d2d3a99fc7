"""``llmgw``, the operators' command-line client, against a live control plane over real HTTP:
each command's output and exit status, a wrong or revoked key, a server that is down, a
config file others can read, and ``apply -f`` with a bad file changing nothing."""

from __future__ import annotations

import asyncio
import io
import json
import os
import subprocess
import sys

import pytest
from django.contrib.auth import get_user_model

from agentd import ctl
from agentd.ctl import client, exits
from fleet.models import GPU, ApiKey, JoinToken, Model, Node
from fleet.services import api_keys
from tests.consumer.test_live_agent_socket import connect, enrol, recv
from tests.factories import (
    add_node,
    enrol_node,
    grant,
    manage_key,
    operator,
    register_msg,
    report_gpu_events,
    report_load,
    staff_user,
)
from tests.processes import ROOT, free_port

pytestmark = [pytest.mark.live, pytest.mark.django_db(transaction=True)]

CATALOG = """\
models:
  - name: tiny
    replicas: 1
    priority: 40
    profiles:
      - name: cpu
        engine: llamacpp
        model_path: /models/tiny.gguf
        context_tokens: 8192
        sequences: 4
"""


@pytest.fixture
def cli(live_web, monkeypatch, tmp_path):
    """Runs ``llmgw ARGS`` in this process against the live server; (status, out, err)."""
    _, secret = manage_key()
    monkeypatch.setenv("LLMGW_URL", live_web.url)
    monkeypatch.setenv("LLMGW_API_KEY", secret)
    monkeypatch.setattr(client, "CONFIG_PATH", tmp_path / "no-such-cli.yaml")

    def run(*args: str) -> tuple[int, str, str]:
        out, err = io.StringIO(), io.StringIO()
        status = ctl.main(list(args), out=out, err=err)
        return status, out.getvalue(), err.getvalue()

    run.secret = secret
    run.url = live_web.url
    return run


def test_nodes_prints_the_table_with_unknown_memory_as_a_dash(cli):
    add_node("gpu-01", memory_gb=None)
    add_node("gpu-02", memory_gb=256)
    report_load("gpu-02", cpu_percent=41.0)

    status, out, err = cli("nodes")

    assert (status, err) == (0, "")
    header, *rows = out.splitlines()
    # the same columns as manage.py nodes (agentd.tables)
    assert header.split() == ["NODE", "STATE", "CPU", "%", "MEM", "(GB)", "GPUS", "ENGINES",
                              "SHARDS", "(READY/ALL)", "VLLM", "BUILD", "INSTALLS"]  # fmt: skip
    by_node = {r.split()[0]: r.split() for r in rows}
    assert by_node["gpu-01"][2:4] == ["-", "-"], "CPU and memory unknown: '-'"
    assert by_node["gpu-02"][2:4] == ["41", "256"]

    status, out, _ = cli("--json", "nodes")
    assert status == 0
    assert {r["node"]: r["memory_gb"] for r in json.loads(out)} == {
        "gpu-01": "-",
        "gpu-02": "256",
    }


def test_engine_build_sets_a_nodes_vllm_build_and_node_shows_it_with_installs(cli):
    failed = {"engine": "vllm", "version": "0.11.2", "variant": "cu13", "state": "failed",
              "detail": "pip install exited with 1\n..."}  # fmt: skip
    add_node("gpu-01", provision=[failed])

    status, out, err = cli("engine-build", "gpu-01", "cu129")
    assert (status, out, err) == (0, "gpu-01: vLLM build cu129 (the node is told at once)\n", "")
    assert Node.objects.get(pk="gpu-01").vllm_build == "cu129"

    status, out, _ = cli("node", "gpu-01")
    assert status == 0
    assert "vLLM build   cu129" in out
    assert "installs     vllm 0.11.2 cu13 failed: pip install exited with 1" in out


def test_node_shows_one_node_and_a_missing_one_is_exit_1(cli):
    add_node("gpu-01", memory_gb=256)

    status, out, _ = cli("node", "gpu-01")
    assert status == 0
    assert "node         gpu-01" in out and "memory       256.0 GB" in out

    status, out, err = cli("node", "gpu-99")
    assert status == exits.EXIT_REFUSED and out == ""
    assert "not found" in err and "nodes/gpu-99/" in err


def test_apply_then_models_and_explain(cli, tmp_path):
    catalog = tmp_path / "catalog.yaml"
    catalog.write_text(CATALOG)

    status, out, _ = cli("apply", "-f", str(catalog), "--dry-run")
    assert status == 0 and out.startswith("would change: ")
    assert not Model.objects.exists(), "a dry run changes nothing"

    status, out, _ = cli("apply", "-f", str(catalog))
    assert status == 0 and "tiny" in out
    assert Model.objects.get(name="tiny").desired_replicas == 1
    assert cli("apply", "-f", str(catalog))[1] == "nothing to change\n"

    status, out, _ = cli("models")
    # model, team (none: the fleet's), replicas, priority
    assert status == 0 and out.splitlines()[1].split()[:4] == ["tiny", "-", "1", "40"]
    profile = Model.objects.get(name="tiny").active_profile
    assert (profile.context_tokens, profile.sequences) == (8192, 4)

    add_node("cpu-01")
    status, out, _ = cli("explain", "tiny")
    assert status == 0
    assert out.startswith("model tiny, profile cpu: ") and "cpu-01" in out


def test_models_says_which_sleep_and_how(cli, tmp_path):
    catalog = tmp_path / "catalog.yaml"
    sleepy = CATALOG.replace(
        "    priority: 40\n",
        "    priority: 40\n    sleep_after_s: 300\n    sleep_level: 2\n",
    )
    awake = CATALOG.replace("name: tiny", "name: awake").split("models:\n", 1)[1]
    catalog.write_text(sleepy + awake)
    assert cli("apply", "-f", str(catalog))[0] == 0

    status, out, _ = cli("models")

    assert status == 0
    header, *rows = out.splitlines()
    at = header.index("SLEEP")
    assert header[at:].split()[:2] == ["SLEEP", "PROFILE"]
    sleep = {r.split()[0]: r[at:].split("  ")[0] for r in rows}
    assert sleep == {"tiny": "after 300 s idle, level 2", "awake": "-"}

    # a bad value is refused naming the field, and changes nothing
    catalog.write_text(sleepy.replace("sleep_level: 2", "sleep_level: 3"))
    status, _, err = cli("apply", "-f", str(catalog))
    assert status != 0 and "model tiny.sleep_level" in err
    assert Model.objects.get(name="tiny").sleep_level == 2


def test_explain_with_a_file_asks_what_if_and_saves_nothing(cli, tmp_path):
    catalog = tmp_path / "catalog.yaml"
    catalog.write_text(CATALOG)
    add_node("cpu-01")

    status, out, err = cli("explain", "tiny", "-f", str(catalog))

    assert (status, err) == (0, ""), err
    assert "cpu-01" in out
    assert not Model.objects.exists()


def test_apply_with_a_bad_file_changes_nothing_and_says_what_is_wrong(cli, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(CATALOG + "  - name: broken\n    replicas: -3\n")

    status, out, err = cli("apply", "-f", str(bad))

    assert status == exits.EXIT_REFUSED and out == ""
    assert f"{bad}: nothing applied:" in err and "broken" in err and "replicas" in err
    assert not Model.objects.exists(), "all or nothing: the good entry was not applied either"

    status, _, err = cli("apply", "-f", str(tmp_path / "missing.yaml"))
    assert status == exits.EXIT_USAGE and "cannot read" in err


def test_cordon_uncordon_and_drain_change_the_node(cli):
    add_node("gpu-01")

    assert cli("cordon", "gpu-01")[:2] == (0, "gpu-01: cordoned (no new placements)\n")
    assert Node.objects.get(pk="gpu-01").cordoned
    assert cli("uncordon", "gpu-01")[:2] == (0, "gpu-01: takes placements\n")
    assert not Node.objects.get(pk="gpu-01").cordoned

    # nothing runs there, so --wait returns at once
    status, out, _ = cli("drain", "gpu-01", "--wait", "--timeout", "30")
    assert status == 0
    assert out.splitlines() == ["gpu-01: drained, nothing runs there", "gpu-01: " + (
        "draining (cordoned; its replicas move elsewhere)")]  # fmt: skip
    assert Node.objects.get(pk="gpu-01").draining


def test_gpu_clear_clears_a_fault_with_its_reason_and_node_shows_health(cli):
    add_node("gpu-01")
    report_gpu_events("gpu-01", (3, "xid", 79), (5, "xid", 13))

    status, out, _ = cli("node", "gpu-01")
    assert status == 0
    assert "gpu 3: NVIDIA H100 80GB HBM3, 0/81559 MB, failed (XID 79: GPU has fallen off " in out
    assert "gpu 5: NVIDIA H100 80GB HBM3, 0/81559 MB, healthy, XIDs 13×1\n" in out

    # no reason, or not a GPU: usage, nothing sent
    assert cli("gpu", "clear", "gpu-01/3", "--reason", " ")[0] == exits.EXIT_USAGE
    status, _, err = cli("gpu", "clear", "gpu-01", "--reason", "x")
    assert status == exits.EXIT_USAGE and "name it NODE/INDEX, like gpu-07/3" in err
    status, _, err = cli("gpu", "clear", "gpu-01/9", "--reason", "x")
    assert (status, err) == (exits.EXIT_REFUSED, "llmgw gpu: no GPU 9 on node 'gpu-01'\n")
    assert GPU.objects.get(node_id="gpu-01", index=3).fault == "failed"

    status, out, err = cli("gpu", "clear", "gpu-01/gpu3", "--reason", "reseated")

    assert (status, err) == (0, "")
    assert out == "GPU gpu-01/gpu3 cleared by user 'ops': reseated; it is healthy now\n"
    assert GPU.objects.get(node_id="gpu-01", index=3).health == "healthy"


def test_gpu_clear_without_the_permission_is_exit_3(cli, monkeypatch):
    add_node("gpu-01")
    report_gpu_events("gpu-01", (3, "xid", 79))
    viewer = grant(staff_user("viewer"), "fleet.view_gpu", "fleet.view_node")
    _, secret = manage_key(user=viewer)
    monkeypatch.setenv("LLMGW_API_KEY", secret)

    status, _, err = cli("gpu", "clear", "gpu-01/3", "--reason", "reset")

    assert status == exits.EXIT_AUTH and "the key's user may not do this" in err
    assert GPU.objects.get(node_id="gpu-01", index=3).fault == "failed"


def test_node_notice_drains_the_node_and_node_shows_the_notice(cli):
    add_node("gpu-01")

    status, _, err = cli("node", "notice", "gpu-01", "--in", "soon")
    assert status == exits.EXIT_USAGE and "--in 'soon' is not a time ahead" in err
    status, _, err = cli("node", "notice", "gpu-01")
    assert status == exits.EXIT_USAGE and "--in 120s" in err
    status, _, err = cli("node", "notice", "gpu-01", "--in", "8d")
    assert status == exits.EXIT_REFUSED and "a notice is 0 to 604800 s (a week) ahead" in err
    assert Node.objects.get(pk="gpu-01").notice_deadline is None

    status, out, err = cli("node", "notice", "gpu-01", "--in", "2m", "--reason", "spot reclaim")

    assert (status, err) == (0, "")
    assert out == (
        "node gpu-01 goes away in 120 s (operator: spot reclaim, said by user 'ops'): "
        "draining it now, replacements first\n"
    )
    node = Node.objects.get(pk="gpu-01")
    assert node.draining and node.notice_reason == "spot reclaim"
    status, out, _ = cli("node", "gpu-01")
    assert status == 0 and "(operator: spot reclaim)" in out and "\nnotice " in out
    assert cli("node", "gpu-01", "--in", "2m")[0] == exits.EXIT_USAGE


def test_revoke_asks_for_yes_then_revokes(cli):
    enrol_node("gpu-01")
    status, _, err = cli("revoke", "gpu-01")
    assert status == exits.EXIT_USAGE and "add --yes" in err
    assert Node.objects.get(pk="gpu-01").credentials.filter(revoked_at=None).exists()

    status, out, _ = cli("revoke", "gpu-01", "--yes")
    assert status == 0 and "credential(s) revoked" in out
    assert not Node.objects.get(pk="gpu-01").credentials.filter(revoked_at=None).exists()


def test_join_tokens_and_api_keys_are_made_with_their_secret_printed_once(cli, monkeypatch):
    status, out, err = cli("join-token", "rack 4", "--uses", "3", "--ttl", "2h")
    assert status == 0 and "shown only once" in err
    token = JoinToken.objects.get(name="rack 4")
    assert token.max_uses == 3 and out.strip().startswith(f"lgj_{token.prefix}_")

    status, out, _ = cli("api-key", "ci pipeline", "--scope", "manage")
    assert status == 0
    monkeypatch.setenv("LLMGW_API_KEY", out.strip())
    assert cli("nodes")[0] == 0, "the new manage key works"
    assert ApiKey.objects.get(name="ci pipeline").user.username == "ops", "acts as its maker"

    status, _, err = cli("api-key", "client", "--expires", "yesterday")
    assert status == exits.EXIT_REFUSED and "yesterday" in err
    assert not ApiKey.objects.filter(name="client").exists()

    Model.objects.create(name="small")
    status, _, _ = cli(
        "api-key", "client", "--fallbacks", "small", "--max-concurrent", "4", "--share-weight", "3"
    )
    made = ApiKey.objects.get(name="client")
    assert status == 0 and made.fallbacks == ["small"]
    assert (made.max_concurrent, made.share_weight) == (4, 3)
    status, _, err = cli("api-key", "other", "--fallbacks", "ghost")
    assert status == exits.EXIT_REFUSED and "no model named 'ghost'" in err


def test_teams_lists_use_against_quotas_and_api_key_gives_a_key_to_a_team(cli):
    from django.contrib.auth.models import Group

    from fleet.models import Team

    assert cli("teams") == (0, "no teams: every model and key is the fleet's\n", "")
    research = Team.objects.create(
        name="research",
        group=Group.objects.create(name="research"),
        max_gpus=8,
        max_priority=50,
        guaranteed_gpu_memory_gb=40,
    )
    status, out, _ = cli("teams")
    assert status == 0
    lines = out.splitlines()
    assert lines[0].split()[:3] == ["TEAM", "MEMBERS", "GPUS"]
    assert lines[0].split()[-4:] == ["MAX", "PRIORITY", "GUARANTEED", "(GB)"]
    assert lines[1].split() == ["research", "-", "0", "of", "8", "0.0", "0", "0", "50", "40"]

    status, _, _ = cli("api-key", "notebook", "--team", "research")
    assert status == 0 and ApiKey.objects.get(name="notebook").team == research
    status, _, err = cli("api-key", "other", "--team", "nope")
    assert status == exits.EXIT_REFUSED and "no team named 'nope'" in err


def test_adapters_lists_each_with_its_model_and_where_it_is_loaded(cli):
    from fleet.models import Adapter, Shard
    from tests.factories import add_model, add_node, add_replica

    assert cli("adapters")[1].startswith("no adapters")
    add_node("gpu-01")
    model = add_model("qwen", max_adapters=2)
    shard = add_replica(model, model.active_profile, ["gpu-01"]).shards.get()
    Adapter.objects.create(name="qwen-sql", model=model, source="/lora/sql.gguf")
    Adapter.objects.create(name="qwen-bad", model=model, source="/lora/bad.gguf")
    Shard.objects.filter(pk=shard.pk).update(
        adapters=[
            {"name": "qwen-sql", "state": "loaded", "error": "", "id": 0},
            {"name": "qwen-bad", "state": "failed", "error": "bad magic", "id": None},
        ]
    )
    status, out, _ = cli("adapters")
    assert status == 0
    lines = out.splitlines()
    assert lines[0].split() == ["ADAPTER", "MODEL", "SOURCE", "LOADED", "ON"]
    assert lines[1].split() == [
        "qwen-bad",
        "qwen",
        "/lora/bad.gguf",
        "gpu-01",
        "(failed):",
        "bad",
        "magic",
    ]
    assert lines[2].split() == ["qwen-sql", "qwen", "/lora/sql.gguf", "gpu-01", "(loaded)"]


def test_usage_totals_and_hours_and_a_rotated_key_keeps_working_for_its_grace(cli, monkeypatch):
    from datetime import timedelta

    from django.utils import timezone

    from fleet.models import KeyUsage

    key, secret = api_keys.create_api_key("team-a")
    hour = timezone.now().replace(minute=0, second=0, microsecond=0)
    for ago, (requests, prompt, completion) in ((0, (3, 30, 90)), (1, (2, 20, 60))):
        KeyUsage.objects.create(
            key=key, model="tiny", hour=hour - timedelta(hours=ago), requests=requests,
            prompt_tokens=prompt, completion_tokens=completion,
        )  # fmt: skip

    status, out, _ = cli("usage", "--key", "team-a")
    assert status == 0
    assert out.splitlines()[1].split() == ["team-a", "tiny", "5", "50", "150"]
    status, out, _ = cli("usage", "--hourly", "--since", "24h")
    assert status == 0 and len(out.splitlines()) == 3
    status, _, err = cli("usage", "--since", "soon")
    assert status == exits.EXIT_REFUSED and "since: 'soon'" in err

    status, out, err = cli("rotate-key", key.prefix, "--grace", "1h")
    assert status == 0 and "rotated; the old secret works until" in err
    assert out.strip() != secret and out.startswith(f"lgk_{key.prefix}_")
    key.refresh_from_db()
    assert key.previous_secret_expires_at is not None
    status, _, err = cli("rotate-key", "nosuchkey")
    assert status == exits.EXIT_REFUSED and "no API key with prefix 'nosuchkey'" in err


def test_a_wrong_or_revoked_key_is_exit_3_and_says_so(cli, monkeypatch):
    monkeypatch.setenv("LLMGW_API_KEY", "lgk_nothing_like_a_key")
    status, out, err = cli("nodes")
    assert status == exits.EXIT_AUTH and out == ""
    assert "the key was refused" in err and "unknown API key" in err

    key, secret = manage_key(operator("ops-2"))
    api_keys.revoke_api_key(key)
    monkeypatch.setenv("LLMGW_API_KEY", secret)
    status, _, err = cli("nodes")
    assert status == exits.EXIT_AUTH and "revoked" in err


def test_a_server_that_is_down_is_exit_4_naming_it(cli, monkeypatch):
    url = f"http://127.0.0.1:{free_port()}"
    monkeypatch.setenv("LLMGW_URL", url)

    status, out, err = cli("nodes")

    assert status == exits.EXIT_UNREACHABLE and out == ""
    assert f"cannot reach the control plane at {url}" in err


def test_the_config_file_must_be_its_owner_s_alone(cli, monkeypatch, tmp_path):
    monkeypatch.delenv("LLMGW_URL")
    monkeypatch.delenv("LLMGW_API_KEY")
    config = tmp_path / "cli.yaml"
    config.write_text(f"url: {cli.url}\napi_key: {cli.secret}\n")
    config.chmod(0o644)

    status, _, err = cli("--config", str(config), "nodes")
    assert status == exits.EXIT_USAGE
    assert "readable by others (mode 644)" in err and f"chmod 600 {config}" in err

    config.chmod(0o600)
    assert cli("--config", str(config), "nodes")[0] == 0

    status, _, err = cli("--config", str(tmp_path / "none.yaml"), "nodes")
    assert status == exits.EXIT_USAGE and "no control plane named" in err


async def test_logs_asks_the_connected_agent_and_a_node_without_a_socket_is_exit_1(live_web, cli):
    from asgiref.sync import sync_to_async

    status, _, err = await sync_to_async(cli)("logs", "gpu-01")
    assert status == exits.EXIT_REFUSED and "not found" in err

    credential = await enrol(live_web, "gpu-01")
    # The enrolling socket has closed; the node is marked disconnected in a batch soon
    # after (on a busy machine, after the logs request had gone to the closed socket).
    for _ in range(100):
        if not await Node.objects.filter(pk="gpu-01", connected=True).aexists():
            break
        await asyncio.sleep(0.1)
    status, _, err = await asyncio.to_thread(cli, "logs", "gpu-01")
    assert status == exits.EXIT_REFUSED and "no agent connected" in err

    async with connect(live_web, credential) as ws:
        await ws.send(json.dumps(register_msg("gpu-01")))
        await recv(ws, "ack")
        await recv(ws, "desired")
        asked = asyncio.ensure_future(asyncio.to_thread(cli, "logs", "gpu-01", "-n", "2"))
        request = await recv(ws, "logs_request", timeout=15)
        assert (request["source"], request["lines"]) == ("agent", 2)
        await ws.send(
            json.dumps(
                {
                    "type": "logs_reply",
                    "v": 1,
                    "request_id": request["request_id"],
                    "lines": ["engine up", "ready"],
                    "sources": ["agent"],
                }
            )
        )
        status, out, err = await asyncio.wait_for(asked, 30)
    assert (status, out, err) == (0, "engine up\nready\n", "")


def test_the_installed_entry_point_runs_and_usage_errors_are_exit_2(cli):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-m", "agentd.ctl", "nodes"],
        capture_output=True, text=True, env=env, timeout=60, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("no nodes yet")
    bad = subprocess.run(
        [sys.executable, "-m", "agentd.ctl", "frobnicate"],
        capture_output=True, text=True, env=env, timeout=60, cwd=ROOT,
    )  # fmt: skip
    assert bad.returncode == exits.EXIT_USAGE and "invalid choice: 'frobnicate'" in bad.stderr


def test_weights_and_gc_weights(cli):
    from datetime import timedelta

    from django.utils import timezone

    from fleet.models import LocalWeights

    # given: a node holding weights nothing needs, unused for two days
    add_node("gpu-01", as_reported=True)
    LocalWeights.objects.update(unused_since=timezone.now() - timedelta(days=2))

    status, out, _ = cli("weights", "--unused")
    assert status == 0
    header, row = out.splitlines()
    assert header.split()[:3] == ["NODE", "PATH", "SIZE"]
    assert row.split()[:4] == ["gpu-01", "/models/qwen", "14.0", "GiB"]

    status, out, _ = cli("gc-weights", "--dry-run")
    assert status == 0
    assert out.splitlines() == [
        "gpu-01 /models/qwen (14.0 GiB): unused for 48 h (retention 24 h)",
        "would propose 1 for removal",
    ]
    assert LocalWeights.objects.get().removal == ""
    status, out, _ = cli("gc-weights")
    assert status == 0 and out.splitlines()[-1] == "proposed 1 for removal"
    assert LocalWeights.objects.get().removal == "proposed"


def test_replica_drain_by_the_name_events_print_and_a_prefix_naming_two_is_refused(cli):
    from fleet.models import Event, Replica
    from tests.factories import add_model
    from tests.reconciler.helpers import Clock, make_ready

    add_node("gpu-01")
    add_node("gpu-02")
    model = add_model(replicas=2)
    Clock().pass_()
    make_ready(model)
    first, second = Replica.objects.filter(model=model).order_by("created_at")

    # events and pages print MODEL#<8 characters>
    status, out, err = cli("replica", "drain", f"{model.name}#{first.pk[:8]}")

    assert (status, err) == (0, "")
    assert out.startswith(f"drain of {model.name}#{first.pk[:8]} asked by user 'ops': a repl")
    first.refresh_from_db()
    assert first.evict == "drain"
    assert Event.objects.filter(kind="replica", model=model).count() == 1

    # asked again: nothing changes, and it says so (exit 0: the ask stands)
    status, out, _ = cli("replica", "stop", first.pk)
    assert status == 0 and out.strip().endswith("drain was asked already, by user 'ops'")
    assert Model.objects.get(pk=model.pk).desired_replicas == 2

    # a prefix both replicas share (here the empty one) is refused, naming them
    status, _, err = cli("replica", "restart", f"{model.name}#")
    assert status == 2 and "names 2 replicas" in err and "give more of its id" in err
    assert f"{model.name}#{second.pk}" in err
    second.refresh_from_db()
    assert second.evict == ""


def test_canary_promote_and_abort_say_what_happened_and_a_model_without_one_is_refused(
    cli, tmp_path
):
    from fleet.models import EngineProfile

    path = tmp_path / "catalog.yaml"
    path.write_text(
        CATALOG.replace("    priority: 40\n", "    priority: 40\n    profile: cpu\n")
        + "      - name: q4\n        engine: llamacpp\n        model_path: /models/tiny-q4.gguf\n"
    )
    assert cli("apply", "-f", str(path))[0] == 0
    q4 = EngineProfile.objects.get(name="q4")
    Model.objects.filter(name="tiny").update(canary_profile=q4, canary_percent=10)

    status, out, err = cli("canary", "promote", "tiny", "--why", "fewer errors")

    assert (status, err) == (0, "")
    assert out == "canary 'q4' promoted by user 'ops': fewer errors\n"
    assert Model.objects.get(name="tiny").active_profile_id == q4.pk
    status, _, err = cli("canary", "abort", "tiny")
    assert status == 1 and "model 'tiny' runs no canary to abort" in err
    assert cli("canary", "abort", "nope")[2] == "llmgw canary: no model named 'nope'\n"


def test_audit_lists_the_change_llmgw_made_with_its_author_and_door(cli):
    add_node("gpu-07")
    assert cli("drain", "gpu-07")[0] == 0
    assert cli("audit")[0] == exits.EXIT_AUTH, "reading the trail needs its own permission"
    grant(get_user_model().objects.get(username="ops"), "auditlog.view_logentry")

    status, out, err = cli("audit", "--object", "gpu-07", "--since", "1h")

    assert (status, err) == (0, "")
    header, *lines = out.splitlines()
    assert header.split()[:5] == ["WHEN", "(UTC)", "WHO", "DOOR", "ACTION"]
    (line,) = [ln for ln in lines if "update" in ln]
    assert "ops" in line and "llmgw" in line
    assert "cordoned: False → True" in line and "draining: False → True" in line
