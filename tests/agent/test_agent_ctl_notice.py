"""``llmgw node notice NODE --in TIME`` (and ``manage.py notice``) read TIME the same way:
seconds, or a number with s, m or h; anything else is refused naming it."""

import pytest

from agentd.ctl.times import notice_seconds


@pytest.mark.parametrize(
    ("given", "seconds"),
    [
        ("120", 120.0),
        ("120s", 120.0),
        ("2m", 120.0),
        (" 2M ", 120.0),
        ("1.5m", 90.0),
        ("1h", 3600.0),
        ("0", 0.0),
        ("30 s", 30.0),
    ],
)
def test_a_time_ahead_is_read_as_seconds(given, seconds):
    assert notice_seconds(given) == seconds


@pytest.mark.parametrize(
    "given", ["", "s", "soon", "-5", "-1m", "2x", "inf", "nan", "1e999", "2m30s"]
)
def test_anything_else_is_refused_naming_it(given):
    with pytest.raises(ValueError) as exc:
        notice_seconds(given)

    assert str(exc.value) == (
        f"--in '{given}' is not a time ahead: give seconds (120) or 120s, 2m, 1h"
    )
