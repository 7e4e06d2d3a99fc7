"""Priorities between teams over real processes: the API, the reconciler on Celery, agentd
under the NVML double (one H100 80GB) and fake engines holding their GPU memory.

docs/security.md, "Teams": a member sets a priority only within their team's maximum, and
a team's replica takes the place of another team's only while that team holds more GPU
memory than it is guaranteed; the preemption's event says so.
"""

import pytest
import requests
from django.contrib.auth.models import Group, Permission

from fleet.models import ApiKeyScope
from fleet.services.api_keys import create_api_key
from tests.api.test_teams import MEMBER_PERMS
from tests.e2e.helpers import answers, wait_serving
from tests.e2e.test_gpu_sharing import api_replicas, clock, gpu_node, shared_model  # noqa: F401
from tests.factories import staff_user

pytestmark = pytest.mark.django_db(transaction=True)


def member_key(team: str, username: str) -> str:
    """A manage key of a new member of ``team``, whose group grants MEMBER_PERMS."""
    group = Group.objects.get(name=team)
    group.permissions.set(
        Permission.objects.filter(content_type__app_label="fleet", codename__in=MEMBER_PERMS)
    )
    user = staff_user(username)
    user.groups.add(group)
    return create_api_key(username, scope=ApiKeyScope.MANAGE, user=user)[1]


def as_member(stack, key: str, method: str, path: str, body: dict) -> requests.Response:
    return requests.request(
        method,
        f"{stack.url}/api/v1/{path}",
        json=body,
        headers={"Authorization": f"Bearer {key}"},
        timeout=30,
    )


def test_a_teams_priority_takes_only_what_another_team_borrowed(stack):
    # given: one H100 80GB; team b's model "low" holds 70 GB of it, within b's
    # guarantee of 80 GB; team a may set priorities up to 50
    gpu_node(stack)
    stack.api("post", "teams/", json={"name": "a", "max_priority": 50})
    stack.api("post", "teams/", json={"name": "b", "guaranteed_gpu_memory_gb": 80})
    shared_model(stack, "low", 70, team="b")
    wait_serving(stack, "low", timeout=180)
    alice = member_key("a", "alice")

    # when: alice, of team a, gives her new model a priority past a's maximum
    refused = as_member(stack, alice, "post", "models/", {"name": "high", "priority": 90})

    # then: refused, naming the team and the bound
    assert refused.status_code == 400, refused.text
    assert "priority 90 is above the maximum of team 'a', 50" in refused.json()["priority"][0]

    # when: she makes it within the bound, asking for 40 GB of the GPU (9.6 GB are free)
    made = as_member(stack, alice, "post", "models/", {"name": "high", "priority": 50})
    assert made.status_code == 201, made.text
    assert made.json()["team"] == "a"
    profile = as_member(
        stack,
        alice,
        "post",
        "engine-profiles/",
        {
            "model": made.json()["id"],
            "name": "shared",
            "engine": "fake",
            "model_path": str(stack.tmp / "fake-weights"),  # the fake engine loads nothing
            "gpus_per_node": 1,
            "gpu_memory_gb": 40,
        },
    )
    assert profile.status_code == 201, profile.text
    patched = as_member(
        stack,
        alice,
        "patch",
        f"models/{made.json()['id']}/",
        {"active_profile": profile.json()["id"]},
    )
    assert patched.status_code == 200, patched.text

    # then: high waits for room, and b's replica, within its guarantee, is not touched
    (pending,) = stack.wait(
        lambda: [r for r in api_replicas(stack, "high", "pending") if r["reason"]],
        "high's replica to be found no room",
    )
    assert "making room" not in pending["reason"], pending
    assert not stack.api("get", "events/?kind=preempt")["results"]
    assert [r["state"] for r in stack.api("get", "replicas/?model_name=low")["results"]] == [
        "ready"
    ]

    # when: an operator lowers b's guarantee to 20 GB: 50 of its 70 are now borrowed
    (b,) = [t for t in stack.api("get", "teams/")["results"] if t["name"] == "b"]
    stack.api("patch", f"teams/{b['id']}/", json={"guaranteed_gpu_memory_gb": 20})

    # then: high takes low's place, and the event says what b held against its guarantee
    wait_serving(stack, "high", timeout=180)
    (event,) = stack.api("get", "events/?kind=preempt")["results"]
    assert event["model_name"] == "low"
    assert event["reason"].endswith(
        "to make room for high (priority 50): team 'b' holds 70 GB of GPU memory, above its "
        "guaranteed 20 GB"
    ), event
    assert answers(stack, "high") is not None
