"""Unused weights cleaned up over real processes: Celery beat's pass, the node's socket, the
agent's re-check on its disk, and llama.cpp engines holding weights open.

The weights are copies of the tiny GGUF in each agent's weights dir (local-path
entries); a model's own short retention stands in for the fleet's day.
"""

import os
import re
import shutil
import subprocess
from contextlib import ExitStack
from datetime import timedelta

import pytest
import requests
from django.utils import timezone

from fleet.models import EngineProfile, LocalWeights, Model, WeightsEvent
from fleet.services.reconciler import lock
from fleet.services.reconciler import passes as reconciler_passes
from fleet.services.weights_gc import cleanup
from tests.e2e.helpers import answers, apply_model, wait_serving

pytestmark = pytest.mark.django_db(transaction=True)

RETENTION_S = 4


@pytest.fixture
def clock():
    return {"LLMGW_WEIGHTS_GC_INTERVAL_S": "1"}


def weights_dir(tmp_path, tiny_model, *names):
    w = tmp_path / "node-weights"
    w.mkdir()
    for name in names:
        shutil.copyfile(tiny_model, w / name)
    return w


def registered_with(node_id, count):
    return LocalWeights.objects.filter(node_id=node_id).count() == count


def events(action, path=None):
    qs = WeightsEvent.objects.filter(action=action).order_by("pk")
    return list(qs.filter(path=str(path)) if path is not None else qs)


def model_id(name):
    return Model.objects.get(name=name).pk


def test_weights_a_model_scaled_to_zero_leaves_go_after_the_retention(stack, tiny_model, tmp_path):
    # given: a node serving two models, one through a link from outside its weights dir
    w = weights_dir(tmp_path, tiny_model, "tiny.gguf", "held.gguf")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    os.symlink(w / "held.gguf", elsewhere / "link.gguf")
    stack.add_agent("cpu-a", weights_dirs=[str(w)])
    stack.wait(lambda: registered_with("cpu-a", 2), "the node to report its weights")
    apply_model(stack, w / "tiny.gguf", name="tiny", weights_retention_s=RETENTION_S)
    apply_model(stack, elsewhere / "link.gguf", name="linked")
    wait_serving(stack, "tiny")
    wait_serving(stack, "linked")

    # when: an operator asks for held.gguf to go: the control plane cannot tell it is
    # "linked"'s (its profile names another path), so it proposes it
    held = LocalWeights.objects.get(path=str(w / "held.gguf"))
    answer = stack.api("post", f"weights/{held.pk}/remove/")
    assert [p["path"] for p in answer["proposals"]] == [str(w / "held.gguf")]

    # then: the node keeps it, and says why
    (kept,) = stack.wait(lambda: events("kept", w / "held.gguf"), "the node to keep held.gguf")
    print(f"\nkept: {kept.reason}")
    assert re.match(r"kept by the node: held open by engine process \d+", kept.reason), kept.reason
    assert (w / "held.gguf").exists() and (w / "tiny.gguf").exists()
    assert answers(stack, "linked")

    # when: tiny is scaled to zero
    stack.api("patch", f"models/{model_id('tiny')}/", json={"desired_replicas": 0})

    # then: after the retention, beat's pass proposes it and the node removes it from disk
    stack.wait(lambda: not (w / "tiny.gguf").exists(), "tiny.gguf to be removed", timeout=90)
    (removed,) = stack.wait(lambda: events("removed"), "the removal to be recorded")
    assert removed.path == str(w / "tiny.gguf") and removed.node_id == "cpu-a"
    (proposed,) = events("proposed", w / "tiny.gguf")
    assert re.fullmatch(rf"unused for \d+ s \(retention {RETENTION_S} s\)", proposed.reason)
    size = os.path.getsize(tiny_model)
    stack.wait(
        lambda: (
            f'llmgw_weights_reclaimed_bytes_total{{node="cpu-a"}} {float(size)}'
            in requests.get(f"{stack.url}/metrics", timeout=30).text
        ),
        "the reclaimed bytes on /metrics",
    )
    # and the held file stays, its model still serving
    assert (w / "held.gguf").exists()
    assert answers(stack, "linked")


def test_past_the_high_watermark_the_least_recently_used_go_first(stack, tiny_model, tmp_path):
    # given: a model that moved from a.gguf to b.gguf to c.gguf, then was scaled to zero,
    # and d.gguf that nothing ever used: last used d, a, b, c, oldest first
    w = weights_dir(tmp_path, tiny_model, "a.gguf", "b.gguf", "c.gguf", "d.gguf")
    stack.add_agent("cpu-a", weights_dirs=[str(w)])
    stack.wait(lambda: registered_with("cpu-a", 4), "the node to report its weights")
    apply_model(stack, w / "a.gguf", name="m")
    wait_serving(stack, "m")

    def unused(name):
        return LocalWeights.objects.filter(path=str(w / name), unused_since__isnull=False).exists()

    profile = EngineProfile.objects.get(model__name="m")
    for now_on, was in (("b.gguf", "a.gguf"), ("c.gguf", "b.gguf")):
        stack.api("patch", f"engine-profiles/{profile.pk}/", json={"model_path": str(w / now_on)})
        stack.wait(
            lambda now_on=now_on: (
                [s.spec["profile"]["model_path"] for s in _ready("m")] == [str(w / now_on)]
            ),
            f"m to serve from {now_on}",
            timeout=120,
        )
        stack.wait(lambda was=was: unused(was), f"{was} to be seen unused")
    stack.api("patch", f"models/{model_id('m')}/", json={"desired_replicas": 0})
    stack.wait(lambda: unused("c.gguf"), "c.gguf to be seen unused")
    names = ["a.gguf", "b.gguf", "c.gguf", "d.gguf"]
    assert all((w / n).exists() for n in names)  # a day's retention: nothing went yet

    # when: the filesystem counts as past its high watermark (the watermarks lowered to 0 %)
    _restart_beat(
        stack,
        LLMGW_WEIGHTS_RETENTION_S=str(24 * 3600),
        LLMGW_WEIGHTS_HIGH_WATERMARK_PERCENT="0",
        LLMGW_WEIGHTS_LOW_WATERMARK_PERCENT="0",
    )

    # then: the unused entries are proposed least recently used first, and removed
    stack.wait(lambda: not any((w / n).exists() for n in names), "the four to be removed")
    order = [os.path.basename(e.path) for e in events("proposed")]
    assert order == ["d.gguf", "a.gguf", "b.gguf", "c.gguf"]
    assert all("high watermark 0%" in e.reason for e in events("proposed"))


def _ready(name):
    from tests.e2e.helpers import ready_shards

    return ready_shards(name)


def _restart_beat(stack, **env):
    for proc, _ in stack.celery:
        proc.terminate()
    for proc, _ in stack.celery:
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            # A worker's warm shutdown can wait out a prefetched message (seen at 31 s
            # under a loaded CI); the test restarts it for new settings, not to time it.
            proc.kill()
            proc.wait(10)
    stack.env.update(env)
    stack.start_celery()


def test_a_placement_made_between_proposal_and_removal_keeps_its_weights(
    stack, tiny_model, tmp_path, settings
):
    # given: a node with tiny.gguf, a model of it scaled to zero for two days
    w = weights_dir(tmp_path, tiny_model, "tiny.gguf")
    stack.add_agent("cpu-a", weights_dirs=[str(w)])
    stack.wait(lambda: registered_with("cpu-a", 1), "the node to report its weights")
    apply_model(stack, w / "tiny.gguf", name="tiny", replicas=0)
    # This process acts as one of the stack's workers: its Redis, its channel layer.
    settings.REDIS_URL = stack.redis.url
    layers = {**settings.CHANNEL_LAYERS["default"]}
    layers["CONFIG"] = {**layers["CONFIG"], "hosts": [{**layers["CONFIG"]["hosts"][0]}]}
    layers["CONFIG"]["hosts"][0]["address"] = stack.redis.url
    settings.CHANNEL_LAYERS = {"default": layers}
    from channels.layers import channel_layers

    channel_layers.backends.clear()
    lock._client = None
    try:
        now = timezone.now()
        with ExitStack() as held:
            # The stack's worker holds the lock a moment every second: taken between two.
            stack.wait(lambda: _take_pass_lock(held), "the stack's reconciler lock", 30)
            # when: a clean-up pass proposes tiny.gguf (the node's socket now waits
            # for the lock to send it) ...
            cleanup.run_pass(now)
            report = cleanup.run_pass(now + timedelta(days=2))
            assert [p.entry.path for p in report.proposals] == [str(w / "tiny.gguf")]
            # ... and before the proposal reaches the node, a pass places tiny there
            Model.objects.filter(name="tiny").update(desired_replicas=1)
            placed = reconciler_passes.run_pass()
            assert placed.placed == 1
        # then: the socket drops the stale proposal, and the replica serves from its weights
        stack.wait(lambda: events("dropped"), "the proposal to be dropped")
        wait_serving(stack, "tiny")
        assert (w / "tiny.gguf").exists()
        assert events("removed") == []
        (dropped,) = events("dropped")
        assert "its desired set moved from" in dropped.reason
    finally:
        lock._client = None


def _take_pass_lock(held: ExitStack) -> bool:
    """The reconciler lock, kept in ``held`` until it closes; False if a pass holds it now."""
    attempt = ExitStack()
    if attempt.enter_context(lock.pass_lock()):
        held.enter_context(attempt.pop_all())
        return True
    attempt.close()
    return False
