"""Key limits, rotation and usage as operators set and read them: API, commands, the cache."""

import io
import re
from datetime import UTC, datetime, timedelta

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone

from fleet.gateway import keys, usage
from fleet.gateway.errors import GatewayError
from fleet.models import ApiKey, KeyUsage, Model
from fleet.services import api_keys
from tests.factories import inference_key

pytestmark = pytest.mark.django_db


def run(*args) -> tuple[str, str]:
    out, err = io.StringIO(), io.StringIO()
    call_command(*args, stdout=out, stderr=err)
    return out.getvalue(), err.getvalue()


def test_create_api_key_takes_limits_and_the_gateway_falls_back_to_the_defaults(settings):
    settings.LLMGW = {**settings.LLMGW, "GATEWAY_DEFAULT_TOKENS_PER_DAY": 5000}
    run("create_api_key", "team-a", "--rpm", "60", "--tpm", "0", "--tokens-per-month", "900000")

    key = ApiKey.objects.get()
    assert (key.requests_per_minute, key.tokens_per_minute, key.tokens_per_day) == (60, 0, None)
    entry = next(iter(keys.load_keys().values()))
    # its own where set, 0 meaning none, the default where left out
    assert (entry.limits.requests_per_minute, entry.limits.tokens_per_minute) == (60, 0)
    assert (entry.limits.tokens_per_day, entry.limits.tokens_per_month) == (5000, 900000)


def test_a_key_of_a_team_carries_the_teams_month_budget_to_the_gateway():
    from django.contrib.auth.models import Group

    from fleet.models import Team

    research = Team.objects.create(
        name="research", group=Group.objects.create(name="research"), tokens_per_month=10**6
    )
    out, _ = run("create_api_key", "ci", "--team", "research")
    key = ApiKey.objects.get()
    assert key.team == research
    (entry,) = keys.load_keys().values()
    assert (entry.limits.team, entry.limits.team_tokens_per_month) == ("research", 10**6)
    assert entry.limits.on  # checked in Redis, though the key has no limits of its own

    Team.objects.filter(pk=research.pk).update(tokens_per_month=None)
    (entry,) = keys.load_keys().values()
    assert not entry.limits.on
    with pytest.raises(CommandError, match="no team named 'vision' \\(teams: research\\)"):
        run("create_api_key", "other", "--team", "vision")


def test_a_negative_limit_is_refused_naming_it():
    with pytest.raises(CommandError, match="tokens_per_minute must be a whole number"):
        run("create_api_key", "team-a", "--tpm", "-5")
    assert not ApiKey.objects.exists()


def test_a_keys_fallbacks_are_set_in_order_checked_and_cleared_through_the_api(api):
    for name in ("big", "mid", "small"):
        Model.objects.create(name=name)
    created = api.post(
        "/api/v1/api-keys/",
        {"name": "team-c", "models": ["big", "small"], "fallbacks": ["small"]},
        content_type="application/json",
    )
    assert created.status_code == 201, created.content
    prefix = created.json()["prefix"]
    assert ApiKey.objects.get(prefix=prefix).fallbacks == ["small"]

    def patch(body):
        return api.patch(f"/api/v1/api-keys/{prefix}/", body, content_type="application/json")

    # a fallback the key may not use, or that does not exist, is refused and changes nothing
    barred = patch({"fallbacks": ["mid"], "tokens_per_day": 7})
    unknown = patch({"fallbacks": ["ghost"]})
    twice = patch({"fallbacks": ["small", "small"]})
    assert barred.status_code == 400 and "may not use 'mid'" in barred.json()["fallbacks"][0]
    assert unknown.status_code == 400 and "no model named 'ghost'" in unknown.json()["fallbacks"][0]
    assert twice.status_code == 400 and "named twice" in twice.json()["fallbacks"][0]
    key = ApiKey.objects.get(prefix=prefix)
    assert (key.fallbacks, key.tokens_per_day) == (["small"], None)

    # in the order given, and the gateway's cache has them so
    ApiKey.objects.filter(prefix=prefix).update(allowed_models=[])
    assert patch({"fallbacks": ["small", "mid"]}).json()["fallbacks"] == ["small", "mid"]
    (entry,) = [e for e in keys.load_keys().values() if e.prefix == prefix]
    assert entry.fallbacks == ("small", "mid")
    assert patch({"fallbacks": []}).json()["fallbacks"] == []

    # a manage key has none
    manage = api.post(
        "/api/v1/api-keys/",
        {"name": "ops", "scope": "manage", "fallbacks": ["small"]},
        content_type="application/json",
    )
    assert manage.status_code == 400
    assert "inference keys only" in manage.json()["detail"][0]


def test_create_api_key_and_llmgw_take_fallbacks():
    Model.objects.create(name="small")
    run("create_api_key", "team-d", "--fallbacks", "small")
    assert ApiKey.objects.get(name="team-d").fallbacks == ["small"]
    with pytest.raises(CommandError, match="no model named 'ghost'"):
        run("create_api_key", "team-e", "--fallbacks", "small,ghost")
    assert not ApiKey.objects.filter(name="team-e").exists()


def test_limits_are_set_and_cleared_through_the_api(api):
    created = api.post(
        "/api/v1/api-keys/",
        {"name": "team-b", "requests_per_minute": 10, "tokens_per_day": 1000},
        content_type="application/json",
    )
    assert created.status_code == 201, created.content
    prefix = created.json()["prefix"]

    changed = api.patch(
        f"/api/v1/api-keys/{prefix}/",
        {"requests_per_minute": None, "tokens_per_minute": 200},
        content_type="application/json",
    )
    bad = api.patch(
        f"/api/v1/api-keys/{prefix}/", {"tokens_per_day": -1}, content_type="application/json"
    )
    missing = api.patch("/api/v1/api-keys/nope0000/", {}, content_type="application/json")

    assert changed.status_code == 200, changed.content
    assert changed.json() == {
        "name": "team-b",
        "prefix": prefix,
        "requests_per_minute": None,
        "tokens_per_minute": 200,
        "tokens_per_day": 1000,
        "tokens_per_month": None,
        "max_concurrent": None,
        "share_weight": 1,
        "fallbacks": [],
    }
    assert bad.status_code == 400 and "tokens_per_day" in bad.json()
    assert missing.status_code == 404


def test_a_rotated_key_s_old_secret_works_for_its_grace_then_says_why_it_stopped(api):
    key, old = api_keys.create_api_key("team-c")

    resp = api.post(
        f"/api/v1/api-keys/{key.prefix}/rotate/", {"grace": "1h"}, content_type="application/json"
    )

    assert resp.status_code == 201, resp.content
    new = resp.json()["secret"]
    assert new != old and new.startswith(f"lgk_{key.prefix}_")
    table = keys.load_keys()
    now = timezone.now().timestamp()
    # both work in the grace period, as the same key
    for secret in (new, old):
        assert keys.check(table[keys.digest_of(secret)], secret, now).id == key.pk
    # after it, the old one is refused with the reason
    with pytest.raises(GatewayError, match="was rotated; its old secret stopped working"):
        keys.check(table[keys.digest_of(old)], old, now + 3601)
    assert keys.check(table[keys.digest_of(new)], new, now + 3601).id == key.pk
    # the management API's lookup honours the grace too
    assert ApiKey.find(old).pk == key.pk
    ApiKey.objects.filter(pk=key.pk).update(
        previous_secret_expires_at=timezone.now() - timedelta(seconds=1)
    )
    assert ApiKey.find(old) is None and ApiKey.find(new).pk == key.pk


def test_rotate_api_key_command_prints_the_new_secret_once():
    key, old = api_keys.create_api_key("team-d")
    out, err = run("rotate_api_key", key.prefix, "--grace", "2h")
    assert out.strip().startswith(f"lgk_{key.prefix}_") and out.strip() not in err
    assert "old secret works until" in err
    with pytest.raises(CommandError, match="no API key with prefix 'zzzzzzzz'"):
        run("rotate_api_key", "zzzzzzzz")


def _usage_rows():
    a, _ = inference_key("team-a")
    b, _ = inference_key("team-b")
    now = timezone.now().timestamp()
    counts = usage.Usage()
    counts.add(a.pk, "tiny", 3, 4, now)
    counts.add(a.pk, "tiny", 3, 4, now)
    counts.add(a.pk, "big", 10, 1, now)
    counts.add(b.pk, "tiny", 1, 1, now - 10 * 86400)
    assert usage.write(counts.take()) == {}  # every row written, none left to retry
    assert KeyUsage.objects.count() == 3
    # a second batch adds to the same hour's row
    counts.add(a.pk, "tiny", 1, 2, now)
    usage.write(counts.take())
    return a, b


def test_usage_through_the_api_filtered_by_key_model_and_since(api):
    a, _ = _usage_rows()

    week = api.get("/api/v1/usage/").json()
    by_key = api.get(f"/api/v1/usage/?key={a.prefix}&model=tiny").json()
    month = api.get("/api/v1/usage/?since=30d&key=team-b").json()
    bad = api.get("/api/v1/usage/?since=yesterday")

    assert sorted((r["key"], r["model"]) for r in week) == [("team-a", "big"), ("team-a", "tiny")]
    assert [(r["requests"], r["prompt_tokens"], r["completion_tokens"]) for r in by_key] == [
        (3, 7, 10)
    ]
    hour = datetime.fromisoformat(by_key[0]["hour"].replace("Z", "+00:00"))
    assert hour.minute == 0 and hour.tzinfo is not None
    assert [r["key"] for r in month] == ["team-b"]
    assert bad.status_code == 400 and "yesterday" in bad.json()["since"][0]
    for since in ("2026-13-45T00:00", "99999999999d"):
        assert api.get(f"/api/v1/usage/?since={since}").status_code == 400


def test_usage_command_sums_per_key_and_model():
    _usage_rows()
    out, _ = run("usage", "--since", "30d")
    lines = [re.split(r"\s+", line.strip()) for line in out.splitlines()[1:]]
    assert lines == [
        ["team-a", "big", "1", "10", "1"],
        ["team-a", "tiny", "3", "7", "10"],
        ["team-b", "tiny", "1", "1", "1"],
    ]
    out, _ = run("usage", "--key", "team-b")  # 7 days: nothing
    assert out.splitlines()[1:] == []


def test_usage_rows_are_one_per_hour():
    a, _ = inference_key("team-a")
    counts = usage.Usage()
    t = datetime(2026, 5, 4, 12, 59, 59, tzinfo=UTC).timestamp()
    counts.add(a.pk, "tiny", 1, 1, t)
    counts.add(a.pk, "tiny", 1, 1, t + 1)
    usage.write(counts.take())
    assert [r.hour.hour for r in api_keys.usage(key="team-a")] == [13, 12]


def test_the_admin_shows_a_key_s_usage_per_model_and_edits_its_limits(admin_client):
    a, _ = _usage_rows()

    page = admin_client.get(f"/admin/fleet/apikey/{a.pk}/change/").content.decode()

    assert "tiny: 3 requests, 7 prompt + 10 completion tokens" in page
    assert "big: 1 requests, 10 prompt + 1 completion tokens" in page
    assert 'name="tokens_per_day"' in page and 'name="requests_per_minute"' in page


def test_a_revoked_key_cannot_be_rotated_and_is_told_so_as_a_conflict(api):
    key, _ = api_keys.create_api_key("team-r")
    api_keys.revoke_api_key(key)

    resp = api.post(
        f"/api/v1/api-keys/{key.prefix}/rotate/", {"grace": "1h"}, content_type="application/json"
    )

    # the request is well formed; the key's state is what refuses it
    assert resp.status_code == 409, resp.content
    assert resp.json() == {"detail": f"API key 'team-r' ({key.prefix}) is revoked"}
    key.refresh_from_db()
    assert key.previous_secret_hash == ""


def test_a_limit_past_its_column_is_a_400_naming_it_not_a_database_error(api):
    key, _ = api_keys.create_api_key("team-big")

    resp = api.patch(
        f"/api/v1/api-keys/{key.prefix}/",
        {"tokens_per_minute": 2**31},
        content_type="application/json",
    )
    made = api.post(
        "/api/v1/api-keys/",
        {"name": "huge", "requests_per_minute": 2**40},
        content_type="application/json",
    )

    assert resp.status_code == 400 and "tokens_per_minute" in resp.json(), resp.content
    assert made.status_code == 400 and "requests_per_minute" in made.json(), made.content
    key.refresh_from_db()
    assert key.tokens_per_minute is None and not ApiKey.objects.filter(name="huge").exists()
