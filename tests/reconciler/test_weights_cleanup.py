"""The weights clean-up on the database: inventory kept across reports, the pass, the
proposal's way to the node (dropped when stale), the node's reply, and placement
waiting while a removal is on its way. Time is passed in; nothing sleeps."""

from datetime import timedelta

import pytest
from django.conf import settings
from django.utils import timezone

from agentd import protocol
from fleet.metrics import render
from fleet.models import LocalWeights, Model, Node, WeightsEvent
from fleet.services import inventory
from fleet.services.snapshot import explain_model
from fleet.services.weights_gc import cleanup, delivery
from fleet.services.weights_gc import inventory as weights_inventory
from tests.factories import add_model, add_node, register_msg
from tests.reconciler.helpers import Clock, running
from tests.reconciler.test_reconcile_lock import held_elsewhere

pytestmark = pytest.mark.django_db

W = "/var/lib/llmgw/weights"
GB = 10**9


def report_weights(node_id, *entries, storage=None):
    """The node registers again reporting these weights (path, size[, source])."""
    weights = [
        {"path": e[0], "size_bytes": e[1], **({"source": e[2]} if len(e) > 2 else {})}
        for e in entries
    ]
    fields = {"weights": weights, "gpus": [], "memory_total_mb": 64000}
    if storage is not None:
        fields["storage"] = storage
    inventory.register_node(protocol.parse_agent_message(register_msg(node_id, **fields)))


def row(node_id, path) -> LocalWeights:
    return LocalWeights.objects.get(node_id=node_id, path=path)


def cpu_model(name, path, replicas=1, **fields):
    return add_model(
        name, replicas=replicas, engine="llamacpp", gpus_per_node=0, model_path=path, **fields
    )


class Sent:
    def __init__(self):
        self.messages = []

    def __call__(self, msg):
        self.messages.append(msg)


def test_what_the_control_plane_keeps_about_an_entry_survives_the_next_report():
    add_node("n1")
    report_weights("n1", (f"{W}/a", 5), (f"{W}/b", 7))
    weights_inventory.set_pinned([row("n1", f"{W}/a").pk], True)
    then = timezone.now() - timedelta(hours=3)
    LocalWeights.objects.filter(path=f"{W}/b").update(unused_since=then)

    report_weights("n1", (f"{W}/a", 6), (f"{W}/b", 7), (f"{W}/c", 1, "hf://org/c"))

    a, b, c = (row("n1", f"{W}/{x}") for x in "abc")
    assert (a.pinned, a.size_bytes) == (True, 6)
    assert b.unused_since == then
    assert (c.source, c.pinned) == ("hf://org/c", False)
    report_weights("n1", (f"{W}/c", 1, "hf://org/c"))
    assert list(LocalWeights.objects.values_list("path", flat=True)) == [f"{W}/c"]


def test_a_model_scaled_to_zero_leaves_its_weights_until_the_retention_passes():
    add_node("n1")
    model = cpu_model("tiny", f"{W}/tiny.gguf")
    report_weights("n1", (f"{W}/tiny.gguf", 2 * GB))
    clock = Clock()
    clock.pass_()
    assert running(model)

    # In use: nothing goes, however long.
    assert cleanup.run_pass(clock.now + timedelta(days=9)).proposals == []
    Model.objects.filter(pk=model.pk).update(desired_replicas=0)
    clock.pass_()
    for s in running(model) + list(model.replicas.first().shards.all()):
        s.state = "stopped"
        s.save()
    start = clock.now
    first = cleanup.run_pass(start)
    assert first.proposals == [] and first.became_unused == 1
    assert cleanup.run_pass(start + timedelta(hours=23)).proposals == []

    report = cleanup.run_pass(start + timedelta(hours=25))

    [p] = report.proposals
    assert p.entry.path == f"{W}/tiny.gguf" and p.reason == "unused for 25 h (retention 24 h)"
    r = row("n1", f"{W}/tiny.gguf")
    assert r.removal == "proposed" and r.removal_request_id == report.requests["n1"]
    assert r.removal_desired_version == Node.objects.get(pk="n1").desired_version
    ev = WeightsEvent.objects.get(path=f"{W}/tiny.gguf")
    assert (ev.action, ev.reason) == ("proposed", p.reason)
    # Under way: not proposed twice.
    assert cleanup.run_pass(start + timedelta(hours=25, seconds=10)).proposals == []


def test_a_just_placed_shard_keeps_its_weights_even_before_its_node_hears_of_it():
    add_node("n1")
    report_weights("n1", (f"{W}/tiny.gguf", GB))
    LocalWeights.objects.update(unused_since=timezone.now() - timedelta(days=3))
    model = cpu_model("tiny", f"{W}/tiny.gguf")
    Clock().pass_()  # placed: pending, the agent has not even been told
    assert [s.state for s in running(model)] == ["pending"]

    assert cleanup.dry_run().proposals == []
    assert cleanup.run_pass().became_used == 1


def test_a_placement_between_proposal_and_delivery_drops_the_proposal():
    add_node("n1")
    report_weights("n1", (f"{W}/tiny.gguf", GB))
    LocalWeights.objects.update(unused_since=timezone.now() - timedelta(days=3))
    model = cpu_model("tiny", f"{W}/tiny.gguf", replicas=0)
    report = cleanup.run_pass()
    assert len(report.proposals) == 1
    version = row("n1", f"{W}/tiny.gguf").removal_desired_version

    # Before the node's socket picks the proposal up, the model is scaled up.
    Model.objects.filter(pk=model.pk).update(desired_replicas=1)
    Clock().pass_()
    sent = Sent()
    result = delivery.deliver("n1", report.requests["n1"], version, sent)

    assert result == delivery.DROPPED and sent.messages == []
    r = row("n1", f"{W}/tiny.gguf")
    assert (r.removal, r.removal_request_id) == ("", "")
    ev = WeightsEvent.objects.filter(action="dropped").get()
    assert f"from v{version} to v{version + 1}" in ev.reason
    # The next pass sees the new shard: the weights are in use again.
    assert cleanup.run_pass().proposals == []


def test_a_current_proposal_is_sent_and_placement_waits_for_the_nodes_reply():
    add_node("n1")
    report_weights("n1", (f"{W}/tiny.gguf", GB), (f"{W}/other", 3 * GB))
    LocalWeights.objects.update(unused_since=timezone.now() - timedelta(days=3))
    model = cpu_model("tiny", f"{W}/tiny.gguf", replicas=0)
    report = cleanup.run_pass()
    r = row("n1", f"{W}/tiny.gguf")
    sent = Sent()

    assert delivery.deliver("n1", report.requests["n1"], r.removal_desired_version, sent) == "sent"

    [msg] = sent.messages
    assert sorted(msg.paths) == [f"{W}/other", f"{W}/tiny.gguf"]
    assert msg.desired_version == r.removal_desired_version
    assert msg.request_id == r.removal_request_id
    assert row("n1", f"{W}/tiny.gguf").removal == "sent"
    # Scaled up while the node is removing: it waits for the reply rather than
    # being placed where its weights are about to go.
    Model.objects.filter(pk=model.pk).update(desired_replicas=1)
    assert Clock().pass_().placed == 0
    assert "n1: is removing these weights" in model.replicas.get().reason

    removed, kept = delivery.record_reply(
        "n1",
        protocol.AgentAck(
            type="ack",
            of="remove_weights",
            ok=False,
            request_id=msg.request_id,
            removed=[f"{W}/tiny.gguf"],
            kept=[protocol.KeptWeights(path=f"{W}/other", reason="held open by engine 4242")],
        ),
    )

    assert (removed, kept) == (1, 1)
    assert not LocalWeights.objects.filter(path=f"{W}/tiny.gguf").exists()
    other = row("n1", f"{W}/other")
    assert (other.removal, other.kept_reason) == ("", "held open by engine 4242")
    events = dict(WeightsEvent.objects.exclude(action="proposed").values_list("path", "reason"))
    assert events == {
        f"{W}/tiny.gguf": "removed by the node",
        f"{W}/other": "kept by the node: held open by engine 4242",
    }
    assert Node.objects.get(pk="n1").weights_reclaimed_bytes == GB
    text = render().decode()
    assert 'llmgw_weights_reclaimed_bytes_total{node="n1"} 1e+09' in text
    assert 'llmgw_weights_bytes{node="n1"} 3e+09' in text
    # Kept: not proposed again at once, and the placement goes ahead now.
    assert cleanup.run_pass().proposals == []
    assert Clock().pass_().placed == 1


def test_delivery_waits_while_a_reconciler_pass_holds_the_lock():
    add_node("n1")
    report_weights("n1", (f"{W}/x", GB))
    LocalWeights.objects.update(unused_since=timezone.now() - timedelta(days=3))
    report = cleanup.run_pass()
    version = row("n1", f"{W}/x").removal_desired_version
    sent = Sent()
    with held_elsewhere():
        assert delivery.deliver("n1", report.requests["n1"], version, sent) == delivery.BUSY
        assert cleanup.run_locked().skipped
    assert sent.messages == [] and row("n1", f"{W}/x").removal == "proposed"
    assert delivery.deliver("n1", report.requests["n1"], version, sent) == delivery.SENT


def test_a_model_retention_setting_and_a_pin(settings):
    settings.LLMGW = {**settings.LLMGW, "WEIGHTS_RETENTION_S": 3600.0}
    add_node("n1")
    cpu_model("keep-long", f"{W}/long", replicas=0)
    Model.objects.filter(name="keep-long").update(weights_retention_s=7 * 24 * 3600)
    report_weights("n1", (f"{W}/long", 1), (f"{W}/pinned", 1), (f"{W}/plain", 1))
    weights_inventory.set_pinned([row("n1", f"{W}/pinned").pk], True)
    now = timezone.now()
    cleanup.run_pass(now)

    report = cleanup.run_pass(now + timedelta(hours=2))

    assert [p.entry.path for p in report.proposals] == [f"{W}/plain"]


def test_the_high_watermark_evicts_least_recently_used_first():
    add_node("n1")
    storage = [{"path": W, "free_bytes": 7 * GB, "total_bytes": 100 * GB}]  # 93 % used
    report_weights(
        "n1", (f"{W}/newer", 10 * GB), (f"{W}/oldest", 10 * GB), (f"{W}/older", 10 * GB),
        storage=storage,
    )  # fmt: skip
    now = timezone.now()
    for name, hours in (("oldest", 5), ("older", 4), ("newer", 1)):
        LocalWeights.objects.filter(path=f"{W}/{name}").update(
            unused_since=now - timedelta(hours=hours)
        )

    report = cleanup.run_pass(now)

    # 93 GB used, under 75 GB is the aim: the two least recently used go (73 GB).
    assert [p.entry.path for p in report.proposals] == [f"{W}/oldest", f"{W}/older"]
    assert report.proposals[0].reason.startswith(f"{W} is 93% full (high watermark 85%)")


def test_an_operator_asks_for_removal_and_an_entry_in_use_is_refused():
    add_node("n1")
    report_weights("n1", (f"{W}/tiny.gguf", GB), (f"{W}/spare", GB))
    cpu_model("tiny", f"{W}/tiny.gguf")
    Clock().pass_()
    ids = list(LocalWeights.objects.values_list("pk", flat=True))

    report = weights_inventory.request_removal(ids)

    assert [p.entry.path for p in report.proposals] == [f"{W}/spare"]
    [(refused, why)] = report.refused
    assert refused.path == f"{W}/tiny.gguf" and why.startswith("in use")
    items = {i.row.path: i for i in weights_inventory.listing("n1")}
    assert items[f"{W}/tiny.gguf"].used_by[0].startswith("tiny (")
    assert [i.row.path for i in weights_inventory.listing("n1", unused=True)] == [f"{W}/spare"]


def test_a_removal_asked_for_while_another_pass_runs_is_judged_by_its_own_pass_or_not_at_all():
    add_node("n1")
    report_weights("n1", (f"{W}/spare", GB))
    Clock().pass_()
    [pk] = LocalWeights.objects.values_list("pk", flat=True)

    # while another process's pass holds the lock, the answer is "try again" and
    # nothing is marked, so no later pass acts on a request the answer said was not taken
    with held_elsewhere():
        assert weights_inventory.request_removal([pk], wait_s=0).skipped
    assert not row("n1", f"{W}/spare").remove_requested
    assert cleanup.run_locked().proposals == []

    # once the lock is free, the mark and the pass that judges it go together
    report = weights_inventory.request_removal([pk], wait_s=0)
    assert [p.entry.path for p in report.proposals] == [f"{W}/spare"]
    assert report.proposals[0].reason == "an operator asked to remove it"


def test_a_request_on_one_copy_of_a_shared_path_is_answered_for_every_copy():
    # given: one copy on a shared filesystem, seen by two nodes, pinned through n1's row
    for node_id in ("n1", "n2"):
        add_node(node_id)
        report_weights(node_id, (f"{W}/shared-model", GB))
    LocalWeights.objects.update(shared=True)
    LocalWeights.objects.filter(node_id="n1").update(pinned=True)
    Clock().pass_()

    # when: an operator asks through n2's row
    report = weights_inventory.request_removal([row("n2", f"{W}/shared-model").pk])

    # then: refused as pinned, and the request is answered on every copy, so
    # unpinning later does not remove it on a request already refused
    assert [(e.path, why) for e, why in report.refused] == [(f"{W}/shared-model", "pinned")]
    assert not LocalWeights.objects.filter(remove_requested=True).exists()
    LocalWeights.objects.update(pinned=False)
    assert cleanup.run_locked().proposals == []


def test_explain_says_whether_a_node_holds_the_weights_or_would_fetch_how_much():
    add_node("n1")
    add_node("n2")
    src = "https://models.example/tiny.gguf"
    report_weights("n1", (f"{W}/3f2a", 14_200_000_000, src))
    report_weights("n2")
    cpu_model("tiny", src)
    cpu_model("hub", "hf://org/unseen")

    text = "\n".join(explain_model("tiny").lines())
    assert "n1: fits (CPU, holds the weights)" in text or "n1: fits (holds the weights)" in text
    assert "n2: fits (would fetch 14.2 GB)" in text
    assert "n2: fits (would fetch the weights)" in "\n".join(explain_model("hub").lines())


def test_events_are_kept_for_their_time_then_trimmed(settings):
    settings.LLMGW = {**settings.LLMGW, "WEIGHTS_EVENTS_KEEP_S": 3600.0}
    node = add_node("n1")
    now = timezone.now()
    WeightsEvent.objects.create(node=node, path="/x", action="removed", at=now - timedelta(hours=2))
    WeightsEvent.objects.create(node=node, path="/y", action="removed", at=now)
    cleanup.run_pass(now)
    assert list(WeightsEvent.objects.values_list("path", flat=True)) == ["/y"]


assert settings  # the pytest-django fixture of the same name is what the tests use
