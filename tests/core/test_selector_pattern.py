"""The selector grammar said twice, once as code and once as the schema's pattern: the same.

parse_selector() is what the API enforces; SELECTOR_PATTERN is what the OpenAPI
schema tells clients (the ``selector`` filter, a profile's ``node_selector``).
A selector one accepts and the other refuses is a client misled.
"""

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fleet.selectors import SELECTOR_PATTERN, parse_selector


def parses(text: str) -> bool:
    try:
        parse_selector(text)
    except ValueError:
        return False
    return True


def matches(text: str) -> bool:
    return re.fullmatch(SELECTOR_PATTERN, text) is not None


@pytest.mark.parametrize(
    "text, valid",
    [
        ("", True),
        ("   ", True),
        ("gpu=h100,zone!=b,coding", True),
        ("gpu == h100 , !spot", True),
        ("a,,b", True),
        ("a,", True),
        ("zone=", True),
        ("example.com/tier=gold", True),
        ("!a=b", False),
        ("a, ,b", False),
        (" , ", False),
        ("=b", False),
        ("a-=b", False),
        ("gpu in (h100)", False),
        ("a=b\n", False),
        ("\ta", False),
        ("a\u2003", False),
        ("zone=a/b", False),
    ],
)
def test_pattern_and_parser_agree_on_examples(text, valid):
    assert parses(text) is valid
    assert matches(text) is valid


# Characters that make up selectors, and the blanks and near-misses around them.
ALPHABET = "ab0.-_/=!, \t\n\u00a0"


@settings(max_examples=500, deadline=None)
@given(st.text(alphabet=ALPHABET, max_size=12))
def test_pattern_and_parser_agree_on_anything(text):
    assert matches(text) == parses(text), text
