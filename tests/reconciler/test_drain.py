"""Drains: replacements elsewhere ready first, then the old shards drain and stop."""

from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from fleet.models import Node, ReplicaState
from fleet.services import drain
from tests.factories import add_model, add_node
from tests.reconciler.helpers import Clock, desired, make_ready, replicas, report, running

pytestmark = pytest.mark.django_db


def one_ready_replica_on_gpu01(**model_fields):
    add_node("gpu-01")
    model = add_model(**model_fields)
    clock = Clock()
    clock.pass_()
    make_ready(model)
    clock.pass_()
    add_node("gpu-02")
    return model, clock


def test_drain_moves_a_replica_with_its_replacement_ready_first():
    model, clock = one_ready_replica_on_gpu01()
    [old] = running(model)

    drain.drain_node(Node.objects.get(pk="gpu-01"))
    clock.pass_()

    # a replacement starts on gpu-02 while the old one keeps serving
    node = Node.objects.get(pk="gpu-01")
    assert node.cordoned and node.draining
    new = [s for s in running(model) if s.pk != old.pk]
    assert [s.node_id for s in new] == ["gpu-02"]
    assert desired("gpu-01") == {old.pk: "running"}
    assert "waiting for its replacement (starting)" in str(drain.progress("gpu-01"))

    # the replacement is ready: the old one drains
    report(new[0], "ready")
    clock.pass_()
    assert desired("gpu-01") == {old.pk: "draining"}

    # in-flight requests done, the agent stops it: the node is drained
    report(old, "stopped")
    clock.pass_()
    clock.pass_()
    assert desired("gpu-01") == {}
    node.refresh_from_db()
    assert node.cordoned and not node.draining
    assert drain.progress("gpu-01").done
    ready = [r for r in replicas(model) if r.state == ReplicaState.READY]
    assert len(ready) == 1


def test_nothing_leaves_until_a_replacement_can_run():
    add_node("gpu-01")
    model = add_model(gpus_per_node=8, tp=8, engine="vllm")
    clock = Clock()
    clock.pass_()
    make_ready(model)
    clock.pass_()
    [old] = running(model)

    drain.drain_node(Node.objects.get(pk="gpu-01"))
    clock.advance(30, alive=["gpu-01"])

    assert desired("gpu-01") == {old.pk: "running"}
    text = str(drain.progress("gpu-01"))
    assert "waiting for its replacement (pending: no node fits: gpu-01: draining)" in text


def test_every_replica_on_the_node_gets_its_replacement_at_once():
    add_node("gpu-01")
    model = add_model(replicas=3, gpus_per_node=2, tp=2)
    clock = Clock()
    clock.pass_()
    make_ready(model)
    clock.pass_()
    add_node("gpu-02")

    drain.drain_node(Node.objects.get(pk="gpu-01"))
    clock.pass_()

    on_new = [s for s in running(model) if s.node_id == "gpu-02"]
    assert len(on_new) == 3


def test_wait_reports_progress_until_done():
    model, clock = one_ready_replica_on_gpu01()
    [old] = running(model)
    drain.drain_node(Node.objects.get(pk="gpu-01"))
    seen, placed = [], set()

    def tick():
        # what the agents and the worker do between two looks; a new engine
        # takes a look or two to load, so the wait sees it starting first
        clock.pass_()
        for s in running(model):
            if s.node_id == "gpu-02" and s.pk in placed:
                report(s, "ready")
            placed.add(s.pk)
        if desired("gpu-01").get(old.pk) == "draining":
            report(old, "stopped")

    result = drain.wait("gpu-01", 60, seen.append, tick=tick)

    assert result.done
    texts = [str(p) for p in seen]
    assert texts[-1] == "node gpu-01 drained: nothing runs there; it stays cordoned"
    assert any("waiting for its replacement" in t for t in texts)
    assert any("draining (in-flight requests finish)" in t for t in texts)


def test_drain_command_says_what_it_did_and_times_out_clearly():
    model, clock = one_ready_replica_on_gpu01()
    out = StringIO()

    with pytest.raises(CommandError, match="node 'gpu-01' not drained after 0 s; the drain goes"):
        call_command("drain", "gpu-01", "--no-input", "--wait", "--timeout", "0", stdout=out)

    lines = out.getvalue().splitlines()
    assert lines[0] == "node 'gpu-01' cordoned and draining"
    assert lines[1] == "node gpu-01: 1 replica(s) still there"
    assert "ready here; waiting for a replacement to be placed" in lines[2]

    out = StringIO()
    call_command("drain", "gpu-01", "--no-input", stdout=out)
    assert out.getvalue().strip() == "node 'gpu-01' was already draining"


def test_drain_command_refuses_bad_input():
    with pytest.raises(CommandError, match="no node 'nope'"):
        call_command("drain", "nope", "--no-input")
    add_node("gpu-01")
    with pytest.raises(CommandError, match="--timeout must not be negative"):
        call_command("drain", "gpu-01", "--no-input", "--timeout", "-1")
    assert not Node.objects.get(pk="gpu-01").draining


def test_drain_command_asks_before_moving_anything(monkeypatch):
    one_ready_replica_on_gpu01()
    monkeypatch.setattr("builtins.input", lambda prompt: "n")

    with pytest.raises(CommandError, match="drain cancelled"):
        call_command("drain", "gpu-01")

    assert not Node.objects.get(pk="gpu-01").cordoned


def test_a_drained_node_with_nothing_on_it_finishes_at_the_next_pass():
    add_node("gpu-01")
    clock = Clock()

    drain.drain_node(Node.objects.get(pk="gpu-01"))
    clock.pass_()

    node = Node.objects.get(pk="gpu-01")
    assert node.cordoned and not node.draining
