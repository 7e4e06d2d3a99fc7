"""Models kept to their team's keys, on a real web process (docs/security.md, "Teams"):
another team's key is refused with the team named, the listing leaves the model out,
and a fallback to it is not taken for that key, while its own team's keys are served."""

import json
import urllib.request

import pytest
from django.contrib.auth.models import Group

from fleet.models import Model, Team
from tests.factories import inference_key, ready_model
from tests.gateway.live import post

pytestmark = [pytest.mark.live, pytest.mark.django_db(transaction=True)]


def ask(model: str) -> dict:
    return {"model": model, "messages": [{"role": "user", "content": "hi"}]}


def listed(server, secret) -> list[str]:
    req = urllib.request.Request(
        server.url + "/v1/models", headers={"Authorization": f"Bearer {secret}"}
    )
    with urllib.request.urlopen(req, timeout=30) as resp:
        return [m["id"] for m in json.load(resp)["data"]]


def test_a_model_kept_to_its_team_answers_only_its_teams_keys(gateway_server, upstreams):
    # given: research's model "secret", kept to its keys, and the fleet's "big" with no
    # replica, whose fallback (set by someone who manages every team) is "secret"
    research = Team.objects.create(name="research", group=Group.objects.create(name="research"))
    vision = Team.objects.create(name="vision", group=Group.objects.create(name="vision"))
    engine = upstreams("secret")
    model, _ = ready_model("secret", [engine])
    Model.objects.filter(pk=model.pk).update(team=research, private=True)
    Model.objects.create(name="big", desired_replicas=0, fallbacks=["secret"])
    _, ours = inference_key("ours", team=research)
    _, theirs = inference_key("theirs", team=vision)
    _, nobodys = inference_key("nobodys")

    # when: each key asks for it
    status, _, body = post(gateway_server, "/v1/chat/completions", ask("secret"), ours)
    assert status == 200, body
    for secret, whose in ((theirs, "of another team"), (nobodys, "of no team")):
        status, _, body = post(gateway_server, "/v1/chat/completions", ask("secret"), secret)

        # then: refused, naming the team it is kept to; the engine never asked
        assert status == 403, body
        error = json.loads(body)["error"]
        assert error["code"] == "model_not_allowed"
        assert error["message"] == (
            f"model 'secret' is kept to the API keys of team 'research', and key "
            f"'{'theirs' if secret == theirs else 'nobodys'}' is {whose}"
        )
    assert len(engine.requests) == 1

    # and the listing shows it to its own team's keys only
    assert "secret" in listed(gateway_server, ours)
    assert "secret" not in listed(gateway_server, theirs)

    # and a fallback to it answers research's key, not vision's
    status, headers, body = post(gateway_server, "/v1/chat/completions", ask("big"), ours)
    assert status == 200 and headers["x-llmgw-fallback"] == "secret", body
    status, headers, body = post(gateway_server, "/v1/chat/completions", ask("big"), theirs)
    assert status == 503 and "x-llmgw-fallback" not in headers
    assert json.loads(body)["error"]["code"] == "no_ready_replica"
    assert len(engine.requests) == 2
