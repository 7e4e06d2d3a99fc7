"""The management commands act as the system, or as a named user (``--as``) with that
user's permissions; either way who set a profile's args and env is recorded."""

import io

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from fleet.models import ApiKey, EngineProfile
from tests.factories import grant, manage_key, staff_user

pytestmark = pytest.mark.django_db

CATALOG = """\
models:
  - name: qwen-7b
    profiles:
      - name: cpu
        engine: llamacpp
        model_path: /models/qwen.gguf
        gpus_per_node: 0
        args: [--ctx-size, '2048']
"""


def apply(tmp_path, *options):
    path = tmp_path / "catalog.yaml"
    path.write_text(CATALOG)
    call_command("apply", "-f", str(path), *options, stdout=io.StringIO())


def test_apply_as_the_system_records_when_args_were_set_and_by_no_user(tmp_path):
    apply(tmp_path)

    profile = EngineProfile.objects.get(name="cpu")
    assert profile.args == ["--ctx-size", "2048"]
    assert profile.args_env_changed_by is None and profile.args_env_changed_at is not None


def test_apply_as_a_user_records_them(tmp_path):
    ops = grant(
        staff_user("ops"),
        "fleet.add_model",
        "fleet.add_engineprofile",
        "fleet.set_engine_args_env",
    )

    apply(tmp_path, "--as", "ops")

    assert EngineProfile.objects.get(name="cpu").args_env_changed_by == ops


def test_apply_as_a_user_without_the_args_permission_applies_nothing(tmp_path):
    grant(staff_user("ops"), "fleet.add_model", "fleet.add_engineprofile")

    with pytest.raises(CommandError, match="fleet.set_engine_args_env"):
        apply(tmp_path, "--as", "ops")

    assert not EngineProfile.objects.exists()


def test_as_an_unknown_user_is_refused_rather_than_run_as_the_system(tmp_path):
    with pytest.raises(CommandError, match="no such user"):
        apply(tmp_path, "--as", "nobody")

    assert not EngineProfile.objects.exists()


def test_rotate_as_a_user_needs_the_permission_for_others_keys():
    theirs, _ = manage_key()
    grant(staff_user("keys"), "fleet.change_apikey")

    with pytest.raises(CommandError, match="fleet.manage_others_api_keys"):
        call_command("rotate_api_key", theirs.prefix, "--as", "keys", stdout=io.StringIO())

    assert ApiKey.objects.get(pk=theirs.pk).previous_secret_hash == ""
