"""The fleet's settings: declared once (fleet/conf.py), read typed, documented for operators."""

import dataclasses
from pathlib import Path

import pytest

from fleet.conf import FleetSettings, fleet_settings, from_environ

ROOT = Path(__file__).resolve().parents[2]


def test_unset_variables_take_the_declared_defaults():
    got = FleetSettings.from_mapping(from_environ({}))

    assert got == FleetSettings()
    assert (got.suspect_after_s, got.replace_after_s, got.engines) == (50.0, 300.0, {})


def test_variables_are_read_with_their_types():
    got = FleetSettings.from_mapping(
        from_environ(
            {
                "LLMGW_SUSPECT_AFTER_S": "40",
                "LLMGW_GATEWAY_MAX_RETRIES": "5",
                "LLMGW_ENGINES": "vllm=0.11.0, llamacpp=0.3.16",
                "LLMGW_STATE_DIR": "/elsewhere",  # not a fleet setting: ignored
            }
        )
    )

    assert got.suspect_after_s == 40.0 and isinstance(got.suspect_after_s, float)
    assert got.gateway_max_retries == 5
    assert got.engines == {"vllm": "0.11.0", "llamacpp": "0.3.16"}


@pytest.mark.parametrize(
    "name, value, message",
    [
        ("LLMGW_GATEWAY_MAX_RETRIES", "two", "LLMGW_GATEWAY_MAX_RETRIES='two'"),
        ("LLMGW_SUSPECT_AFTER_S", "50s", "LLMGW_SUSPECT_AFTER_S='50s'"),
        ("LLMGW_ENGINES", "vllm", "'vllm' is not ENGINE=VERSION"),
        ("LLMGW_GATEWAY_PREFIX_LOAD_FACTOR", "0.8", "PREFIX_LOAD_FACTOR='0.8': must be at least 1"),
        ("LLMGW_GATEWAY_PREFIX_CHARS", "0", "PREFIX_CHARS='0': must be at least 1"),
    ],
)
def test_a_value_that_does_not_parse_names_the_variable(name, value, message):
    with pytest.raises(ValueError, match=message):
        from_environ({name: value})


def test_an_unknown_key_is_refused_rather_than_ignored():
    with pytest.raises(ValueError, match="unknown fleet setting.*SUSPECT_AFTER"):
        FleetSettings.from_mapping({"SUSPECT_AFTER": 40})


def test_an_override_in_django_settings_is_seen_at_once(settings):
    settings.LLMGW = {**settings.LLMGW, "LOGS_TIMEOUT_S": 0.3}
    assert fleet_settings().logs_timeout_s == 0.3

    settings.LLMGW = {**settings.LLMGW, "LOGS_TIMEOUT_S": 7.0}
    assert fleet_settings().logs_timeout_s == 7.0


def test_every_setting_is_documented_for_operators():
    docs = (ROOT / "docs" / "operations.md").read_text()
    missing = [
        f"LLMGW_{f.name.upper()}"
        for f in dataclasses.fields(FleetSettings)
        if f"`LLMGW_{f.name.upper()}`" not in docs
    ]
    assert missing == []
