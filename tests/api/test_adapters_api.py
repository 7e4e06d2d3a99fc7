"""LoRA adapters through the API: declared under a model, refused with the reason when
they could never load, scoped to the model's team, and keys limited to them."""

import pytest

from fleet.gateway.keys import load_keys
from fleet.models import Adapter, Model
from fleet.services import api_keys
from tests.api.test_teams import team
from tests.factories import add_model, bearer, manage_key, staff_user

pytestmark = pytest.mark.django_db


def post(client, secret, body):
    return client.post("/api/v1/adapters/", body, content_type="application/json", **bearer(secret))


def test_an_adapter_is_declared_under_its_model_and_listed_with_where_it_is_loaded(client):
    model = add_model("qwen", max_adapters=2)
    _, secret = manage_key()

    made = post(client, secret, {"name": "qwen-sql", "model": model.pk, "source": "/l/sql.gguf"})

    assert made.status_code == 201, made.content
    listed = client.get(f"/api/v1/adapters/?model={model.pk}", **bearer(secret)).json()
    (row,) = listed["results"]
    assert (row["name"], row["model_name"], row["loaded"]) == ("qwen-sql", "qwen", [])


@pytest.mark.parametrize(
    "body, field, words",
    [
        ({"name": "qwen", "source": "/l/a.gguf"}, "name", "is a model's name"),
        ({"name": "a", "source": "ftp://x/a.gguf"}, "source", "ftp"),
        ({"name": "a", "source": "/l/a.gguf", "rank": 17}, "rank", "rank 17"),
        (
            {"name": "a", "source": "/l/a.gguf", "sha256": {"a.gguf": "0" * 64}},
            "sha256",
            "files the node fetches",
        ),
    ],
)
def test_an_adapter_that_could_never_load_is_refused_naming_why(client, body, field, words):
    model = add_model("qwen")
    _, secret = manage_key()

    refused = post(client, secret, {"model": model.pk, **body})

    assert refused.status_code == 400
    assert words in " ".join(refused.json()[field]), refused.json()
    assert not Adapter.objects.exists()


def test_a_model_may_not_take_an_adapters_name():
    model = add_model("qwen")
    Adapter.objects.create(name="qwen-sql", model=model, source="/l/sql.gguf")
    from django.core.exceptions import ValidationError

    with pytest.raises(ValidationError, match="is an adapter's name"):
        Model(name="qwen-sql").full_clean()


def test_another_teams_model_takes_no_adapter_from_a_member_and_nothing_changes(client):
    theirs = add_model("vit")
    Model.objects.filter(pk=theirs.pk).update(team=team("vision"))
    research = team("research")
    alice = staff_user("alice")
    alice.groups.add(research.group)
    from django.contrib.auth.models import Permission

    alice.user_permissions.set(
        Permission.objects.filter(codename__in=["add_adapter", "view_adapter", "change_adapter"])
    )
    _, secret = manage_key(user=alice)

    refused = post(client, secret, {"name": "vit-x", "model": theirs.pk, "source": "/l/x.gguf"})

    assert refused.status_code == 403
    assert "team 'vision'" in refused.json()["detail"]
    assert not Adapter.objects.exists()


def test_a_key_limited_to_an_adapter_may_use_it_and_not_its_base():
    model = add_model("qwen")
    Adapter.objects.create(name="qwen-sql", model=model, source="/l/sql.gguf")

    key, _ = api_keys.create_api_key("sql only", allowed_models=["qwen-sql"])

    entry = next(e for e in load_keys().values() if e.name == "sql only")
    assert entry.may_use("qwen-sql") and not entry.may_use("qwen")
    with pytest.raises(api_keys.ApiKeyError, match="unknown model"):
        api_keys.create_api_key("typo", allowed_models=["qwen-sq"])
