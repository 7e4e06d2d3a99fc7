"""A canary over real processes (docs/operations.md, "Canaries"): llama.cpp on the tiny
model under two profiles, a quarter of the requests to the canary under a steady load,
then promoted, and another one aborted, with no request lost."""

import re
import sys
import time
import urllib.request

import pytest

from fleet.models import Event, Model, Replica
from tests.e2e.helpers import apply_model, wait_serving
from tests.processes import Load

pytestmark = pytest.mark.django_db(transaction=True)

CLIENTS = 4


def served_by_profile(stack) -> dict[str, float]:
    text = urllib.request.urlopen(stack.url + "/metrics", timeout=10).read().decode()
    out: dict[str, float] = {}
    for profile, n in re.findall(
        r'llmgw_gateway_profile_requests_total\{model="tiny-llama",profile="([^"]+)",'
        r'status="200"\} ([0-9.e+]+)',
        text,
    ):
        out[profile] = out.get(profile, 0.0) + float(n)
    return out


def add_profile(stack, model_id: int, name: str, path) -> int:
    return stack.api(
        "post",
        "engine-profiles/",
        json={
            "model": model_id,
            "name": name,
            "engine": "llamacpp",
            "model_path": str(path),
            "args": ["--n_ctx", "512"],
        },  # fmt: skip
    )["id"]


def live_profiles(model_id: int) -> list[str]:
    return sorted(
        Replica.objects.filter(model_id=model_id)
        .exclude(state__in=["draining", "stopped"])
        .values_list("profile__name", flat=True)
    )


def test_a_canary_takes_its_share_then_is_promoted_and_another_aborted_losing_nothing(
    stack, tiny_model, record
):
    # given: two replicas of the model serving, a second profile, steady streaming clients
    stack.add_agent("cpu-a")
    model_id = apply_model(stack, tiny_model, replicas=2)
    wait_serving(stack, count=2)
    q4 = add_profile(stack, model_id, "q4", tiny_model)

    with Load(stack.url, stack.inference_key, clients=CLIENTS, stream_every=2) as load:
        # when: q4 becomes a canary with 25 % of the requests
        stack.api("patch", f"models/{model_id}/", json={"canary_profile": q4, "canary_percent": 25})
        stack.wait(lambda: live_profiles(model_id) == ["cpu", "cpu", "q4"], "the canary's replica")
        wait_serving(stack, count=3)
        before = served_by_profile(stack)
        load.wait_requests(400)
        after = served_by_profile(stack)
        share = (after.get("q4", 0) - before.get("q4", 0)) / sum(
            after[p] - before.get(p, 0) for p in after
        )

        # and it is promoted: q4 is the active profile, its replicas replace the others
        started = time.monotonic()
        done = stack.api("post", f"models/{model_id}/promote/", json={"why": "e2e"})
        assert done["detail"].startswith("canary 'q4' promoted by")
        stack.wait(
            lambda: (
                live_profiles(model_id) == ["q4", "q4"]
                and Replica.objects.filter(model_id=model_id, state="ready").count() == 2
            ),
            "the others replaced by q4",
            120,
        )
        promoted_s = time.monotonic() - started
        load.wait_requests(100)

        # and a third profile tried as a canary is aborted: its replica drains
        third = add_profile(stack, model_id, "q4b", tiny_model)
        stack.api(
            "patch", f"models/{model_id}/", json={"canary_profile": third, "canary_percent": 50}
        )
        stack.wait(lambda: "q4b" in live_profiles(model_id), "the second canary")
        wait_serving(stack, count=3)
        load.wait_requests(100)
        stack.api("post", f"models/{model_id}/abort-canary/")
        stack.wait(lambda: live_profiles(model_id) == ["q4", "q4"], "the canary drained", 60)
        load.wait_requests(100)
    figures = load.summary()

    model = Model.objects.get(pk=model_id)
    assert model.active_profile.name == "q4" and model.canary_profile_id is None
    record(
        "16",
        canary_share_percent=round(share * 100, 1),
        promoted_s=round(promoted_s, 1),
        clients=CLIENTS,
        **figures,
    )
    assert 0.15 <= share <= 0.35, share
    assert figures["failed"] == 0 and figures["broken"] == 0, figures


def answers_by_profile(stack) -> dict[tuple[str, str], float]:
    text = urllib.request.urlopen(stack.url + "/metrics", timeout=10).read().decode()
    out: dict[tuple[str, str], float] = {}
    for profile, status, n in re.findall(
        r'llmgw_gateway_profile_requests_total\{model="tiny-llama",profile="([^"]+)",'
        r'status="([0-9a-z]+)"\} ([0-9.e+]+)',
        text,
    ):
        out[profile, status] = out.get((profile, status), 0.0) + float(n)
    return out


def test_a_canary_answering_500s_is_rolled_back_by_itself_and_the_active_profile_loses_none(
    stack, tiny_model, record
):
    # given: the model on llama.cpp, and a canary on the fake engine that fails every third
    binaries = {"llamacpp": sys.executable, "fake": sys.executable}
    stack.add_agent("cpu-a", engines={"binaries": binaries})
    model_id = apply_model(stack, tiny_model, replicas=2)
    wait_serving(stack, count=2)
    broken = stack.api(
        "post",
        "engine-profiles/",
        json={
            "model": model_id,
            "name": "broken",
            "engine": "fake",
            "model_path": str(stack.tmp / "fake-weights"),  # the fake engine loads nothing
            "args": ["--fail-every", "3"],
        },
    )["id"]
    bounds = {"canary_max_error_rate": 0.05, "canary_min_requests": 12, "canary_window_s": 600}

    with Load(stack.url, stack.inference_key, clients=CLIENTS, stream_every=2) as load:
        load.wait_requests(40)
        # when: the broken profile becomes a canary with 25 % of the requests, and bounds
        stack.api(
            "patch",
            f"models/{model_id}/",
            json={"canary_profile": broken, "canary_percent": 25, **bounds},
        )
        # then: once its first 500 reaches a client, the reconciler rolls it back
        first_bad = stack.wait(
            lambda: min((o.ended for o in load.outcomes if o.status == 500), default=None),
            "the canary's first 500",
            120,
        )
        stack.wait(
            lambda: Model.objects.get(pk=model_id).canary_profile_id is None,
            "the canary rolled back",
            120,
        )
        rollback_s = time.monotonic() - first_bad
        stack.wait(lambda: live_profiles(model_id) == ["cpu", "cpu"], "the canary drained", 60)
        load.wait_requests(60)
    figures = load.summary()

    # and the event gives the figures against the bound
    (said,) = Event.objects.filter(kind="canary", reason__contains="aborted").values_list(
        "reason", flat=True
    )
    assert "error rate" in said and "past its bound of 5.0%" in said, said
    by = answers_by_profile(stack)
    active = {s: n for (p, s), n in by.items() if p == "cpu"}
    canary = {s: n for (p, s), n in by.items() if p == "broken"}
    bad = [o for o in load.outcomes if o.kind != "ok"]
    record(
        "17",
        rollback_s=round(rollback_s, 1),
        canary_requests=int(sum(canary.values())),
        canary_5xx=int(canary.get("500", 0)),
        active_requests=int(sum(active.values())),
        active_failed=int(sum(n for s, n in active.items() if s != "200")),
        clients=CLIENTS,
        **figures,
    )
    assert set(active) == {"200"} and active["200"] > 0, active
    assert canary.get("500", 0) >= 1 and set(canary) <= {"200", "500"}, canary
    # every request a client saw fail was one of the canary's 500s
    assert all(o.status == 500 and "--fail-every" in o.detail for o in bad), bad[:3]
    assert len(bad) == canary["500"]
