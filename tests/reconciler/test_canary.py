"""A canary beside the active profile: its replicas, promote and abort (docs/operations.md,
"Canaries")."""

import re

import pytest
from django.core.exceptions import ValidationError

from fleet.models import EngineProfile, Event, Model, ReplicaState
from fleet.services import canary, permissions
from tests.factories import add_model, add_node, grant, operator, staff_user
from tests.reconciler.helpers import Clock, make_ready, replicas

pytestmark = pytest.mark.django_db


def with_canary(replicas_wanted=4, percent=25):
    for n in ("gpu-01", "gpu-02"):
        add_node(n)
    model = add_model(replicas=replicas_wanted)
    clock = Clock()
    clock.pass_()
    make_ready(model)
    new = EngineProfile.objects.create(
        model=model, name="fp8", engine="fake", model_path="/models/qwen-fp8", gpus_per_node=1
    )
    Model.objects.filter(pk=model.pk).update(canary_profile=new, canary_percent=percent)
    clock.pass_()
    return Model.objects.get(pk=model.pk), new, clock


def live_by_profile(model) -> dict[str, int]:
    out: dict[str, int] = {}
    for r in replicas(model):
        if r.state not in (ReplicaState.DRAINING, ReplicaState.STOPPED):
            out[r.profile.name] = out.get(r.profile.name, 0) + 1
    return out


@pytest.mark.parametrize("wanted, percent, canaries", [(4, 25, 1), (8, 25, 2), (1, 10, 1)])
def test_a_canary_runs_its_share_of_replicas_beside_the_active_ones(wanted, percent, canaries):
    model, _, _ = with_canary(wanted, percent)

    assert live_by_profile(model) == {"default": wanted, "fp8": canaries}


def test_promote_makes_the_canary_active_and_replaces_the_others():
    model, new, clock = with_canary()
    make_ready(model)
    clock.pass_()

    text = canary.promote(model, operator("alice"), "p95 within bounds")
    clock.pass_()

    model.refresh_from_db()
    assert (model.active_profile_id, model.canary_profile_id, model.canary_percent) == (
        new.pk,
        None,
        0,
    )
    assert text == "canary 'fp8' promoted by user 'alice': p95 within bounds"
    # the canary's replica counts now; new ones of it start before old ones leave
    assert live_by_profile(model)["fp8"] > 1
    for _ in range(6):
        make_ready(model)
        clock.pass_()
    assert live_by_profile(model) == {"fp8": 4}
    (event,) = Event.objects.filter(kind="canary", model=model)
    assert event.reason.startswith("canary 'fp8' promoted by user 'alice'")


def test_abort_drains_the_canary_and_leaves_the_active_ones():
    model, new, clock = with_canary()
    make_ready(model)
    clock.pass_()

    ops = operator()
    canary.abort(model, ops, "errors")
    clock.pass_()

    assert live_by_profile(model) == {"default": 4}
    drained = [r for r in replicas(model) if r.profile_id == new.pk]
    assert [r.state for r in drained] == ["draining"]
    with pytest.raises(canary.NoCanary, match="model 'qwen' runs no canary to abort"):
        canary.abort(model, ops)


def test_a_canary_must_be_another_profile_of_the_model_with_a_share():
    model, new, _ = with_canary()
    other = add_model("other")
    for fields, message in [
        ({"canary_percent": 0}, "a canary gets 1 to 99 % of the requests (got 0)"),
        ({"canary_profile": model.active_profile}, "'default' is the active profile already"),
        ({"canary_profile": other.active_profile}, "belongs to another model"),
        ({"canary_profile": None, "canary_percent": 5}, "needs a canary_profile"),
    ]:
        for k, v in fields.items():
            setattr(model, k, v)
        with pytest.raises(ValidationError, match=re.escape(message)):
            model.full_clean()
        model.refresh_from_db()


def test_only_who_may_change_the_model_may_promote_or_abort():
    model, _, _ = with_canary()
    viewer = grant(staff_user("viewer"), "fleet.view_model")

    with pytest.raises(permissions.Refused, match="needs the permission fleet.change_model"):
        canary.promote(model, viewer)
    model.refresh_from_db()
    assert model.canary_profile_id is not None
