"""A catalog file is YAML read with bounded work: no anchors or aliases, at most 1 MiB.

The finding: 572 bytes of nested aliases, sent by a user with view permissions only to
catalog/explain, took 32 s of the web process's CPU and 2.2 GB, stalling every other
request. The document is refused before anything walks it.
"""

import pytest

from fleet.models import Model
from tests.factories import add_node, bearer, grant, manage_key, staff_user

pytestmark = pytest.mark.django_db


def alias_bomb() -> str:
    """The billion laughs as a catalog: nine levels of nine aliases each, in a profile's
    args, which the old code expanded when it validated them (9^9 strings)."""
    lines = ['x0: &l0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for i in range(1, 9):
        lines.append(f"x{i}: &l{i} [" + ", ".join([f"*l{i - 1}"] * 9) + "]")
    lines.append("models:")
    lines.append("  - name: laughs")
    lines.append("    profiles:")
    lines.append("      - {name: p, engine: llamacpp, model_path: /m.gguf, args: *l8}")
    return "\n".join(lines) + "\n"


@pytest.fixture
def viewer(client):
    user = grant(staff_user("viewer"), "fleet.view_node", "fleet.view_model")
    _, secret = manage_key(user)
    client.defaults.update(bearer(secret))
    return client


def test_an_alias_bomb_is_refused_at_once_naming_aliases(viewer):
    # given a fleet, and a user who may only look at it
    add_node("gpu-01", as_reported=True)
    text = alias_bomb()
    assert len(text) < 1024

    # when they ask what would happen with the bomb applied
    resp = viewer.post(
        "/api/v1/catalog/explain/",
        {"model": "laughs", "catalog": text},
        content_type="application/json",
    )

    # then it is a 400 that says what is wrong and where, and nothing was made
    assert resp.status_code == 400, resp.content
    (message,) = resp.json()["catalog"]
    assert "aliases are not allowed" in message
    assert "line 1" in message
    assert not Model.objects.filter(name="laughs").exists()


def test_apply_refuses_an_alias_too(api):
    text = "models:\n  - &m {name: twice}\n  - *m\n"

    resp = api.post("/api/v1/catalog/apply/", {"catalog": text}, content_type="application/json")

    assert resp.status_code == 400, resp.content
    assert "aliases are not allowed" in resp.json()["catalog"][0]
    assert not Model.objects.filter(name="twice").exists()


def test_deep_nesting_is_refused_naming_the_depth(api):
    text = "models: []\nx: " + "[" * 200 + "]" * 200 + "\n"

    resp = api.post("/api/v1/catalog/apply/", {"catalog": text}, content_type="application/json")

    assert resp.status_code == 400, resp.content
    assert "nested more than 64 levels" in resp.json()["catalog"][0]
