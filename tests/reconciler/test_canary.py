"""A canary beside the active profile: its replicas, promote and abort (docs/operations.md,
"Canaries")."""

import re
from datetime import timedelta

import pytest
from django.core.exceptions import ValidationError

from fleet.models import EngineProfile, Event, Model, ReplicaState
from fleet.services import canary, canary_figures, permissions
from fleet.services.canary_figures import Tally
from tests.factories import add_model, add_node, grant, operator, staff_user
from tests.reconciler.helpers import Clock, make_ready, replicas

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _no_figures_of_other_tests():
    """Profile ids come round again in a fresh database: so would their canary's figures."""
    canary_figures.forget()
    yield
    canary_figures.forget()


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


# ---- judged by its bounds ------------------------------------------------------------------


def tally(requests, errors=0, ttft=()):
    t = Tally(requests, errors)
    for s in ttft:
        t.first_token(s)
    return t


def bounded(model, **fields):
    defaults = dict(
        canary_max_error_rate=0.05,
        canary_max_ttft_ratio=2.0,
        canary_min_requests=100,
        canary_window_s=300,
    )
    Model.objects.filter(pk=model.pk).update(**{**defaults, **fields})
    model.refresh_from_db()
    return model


@pytest.mark.parametrize(
    "canary_t, active_t, ready, failures, age_s, auto, verdict",
    [
        # too few answers yet: keep watching, whatever they say
        (tally(99, 50), tally(300), True, 0, 10, False, None),
        # a third 5xx over 120: aborted, with the figures against the bound
        (tally(120, 40), tally(360), True, 0, 10, False,
         ("abort", "error rate 33.3% over 120 answers (active profile 0.0% over 360), past "
                   "its bound of 5.0%")),
        # first tokens 4× slower at p95 than the active profile's: aborted
        (tally(200, 0, [0.9] * 200), tally(600, 0, [0.2] * 600), True, 0, 10, False,
         ("abort", "error rate 0.0% over 200 answers (active profile 0.0% over 600); p95 time "
                   "to first token ≤ 1 s (active ≤ 0.25 s), past its bound of 2× the active "
                   "profile's")),
        # within its bounds, window not over: keep watching
        (tally(200, 1, [0.2] * 200), tally(600, 0, [0.2] * 600), True, 0, 100, True, None),
        # within its bounds for its window, auto-promote on: promoted
        (tally(200, 1, [0.2] * 200), tally(600, 0, [0.2] * 600), True, 0, 300, True,
         ("promote", "within its bounds for its window of 300 s: error rate 0.5% over 200 "
                     "answers (active profile 0.0% over 600); p95 time to first token ≤ 0.25 s "
                     "(active ≤ 0.25 s)")),
        # the same without auto-promote: keep it, an operator promotes
        (tally(200, 1, [0.2] * 200), tally(600), True, 0, 900, False, None),
        # never ready: three failed starts, or its window gone by
        (tally(0), tally(600), False, 3, 10, False,
         ("abort", "its replica never became ready (failed 3 starts in a row)")),
        (tally(0), tally(600), False, 1, 300, False,
         ("abort", "its replica never became ready (not within its window of 300 s)")),
    ],
)  # fmt: skip
def test_a_canary_is_judged_by_its_bounds(
    canary_t, active_t, ready, failures, age_s, auto, verdict
):
    model, _, clock = with_canary()
    model = bounded(model, canary_auto_promote=auto, canary_started_at=clock.now)
    figures = {"fp8": canary_t, "default": active_t}
    now = clock.now + timedelta(seconds=age_s)

    assert canary.judge(model, figures, ready, failures, now) == verdict


def test_the_reconciler_aborts_a_canary_past_its_bound_from_the_gateways_figures():
    model, new, clock = with_canary()
    make_ready(model)
    clock.pass_()
    model = bounded(model)
    # two gateway processes' counts, as they report them
    canary_figures.write(
        "gw-1",
        canary_figures.encode({("qwen", new.pk): {"fp8": tally(70, 25), "default": tally(200)}}),
    )
    canary_figures.write(
        "gw-2",
        canary_figures.encode({("qwen", new.pk): {"fp8": tally(50, 15), "default": tally(160)}}),
    )

    clock.pass_()

    model.refresh_from_db()
    assert model.canary_profile_id is None and model.active_profile.name == "default"
    (event,) = Event.objects.filter(kind="canary", model=model)
    assert event.reason == (
        "canary 'fp8' aborted by the system: error rate 33.3% over 120 answers (active profile "
        "0.0% over 360), past its bound of 5.0%; its replicas drain"
    )
    assert live_by_profile(model) == {"default": 4}
