"""Node labels: the labels in effect, and selectors over them.

Selectors look like ``gpu=h100,zone!=b,coding`` (equality, inequality,
existence, ``!key``).
"""

import re
from dataclasses import dataclass

_KEY = r"[A-Za-z0-9]([A-Za-z0-9._/-]{0,61}[A-Za-z0-9])?"
_VALUE = r"[A-Za-z0-9._-]{0,63}"
# Spaces are the only blanks a selector may have around its terms: Python's idea
# of whitespace (strip(), \s) is wider than other languages', and a client
# checking a selector against SELECTOR_PATTERN must get the answer the API gives.
_TERM = re.compile(rf"(?P<neg>!)?(?P<key>{_KEY})( *(?P<op>!=|==|=) *(?P<value>{_VALUE}))?")
_ITEM = rf"( *(!{_KEY}|{_KEY}( *(!=|==|=) *{_VALUE})?) *)?"
# The whole grammar parse_selector() accepts, as a regular expression that means
# the same in ECMAScript (the OpenAPI schema's dialect) and in Python with re.fullmatch
# (where a bare `$` would also match before a final newline).
SELECTOR_PATTERN = rf"^( *|{_ITEM}(,{_ITEM})*)$"


def effective_labels(agent_labels: dict | None, operator_labels: dict | None) -> dict:
    """The labels in effect on a node: the agent's, overridden key by key by the operator's.

    An agent reports what it finds; an operator's label is intent and wins, so
    an agent can never take a node out of (or into) a selector an operator set.
    """
    return {**(agent_labels or {}), **(operator_labels or {})}


@dataclass(frozen=True)
class Requirement:
    key: str
    op: str  # "=", "!=", "exists", "!exists"
    value: str = ""

    def matches(self, labels: dict) -> bool:
        if self.op == "exists":
            return self.key in labels
        if self.op == "!exists":
            return self.key not in labels
        if self.op == "=":
            return labels.get(self.key) == self.value
        return labels.get(self.key) != self.value

    def __str__(self) -> str:
        if self.op == "exists":
            return self.key
        if self.op == "!exists":
            return f"!{self.key}"
        return f"{self.key}{self.op}{self.value}"


def parse_selector(text: str) -> list[Requirement]:
    """Parse a selector, or raise ValueError naming the bad term."""
    reqs = []
    text = text or ""
    for raw in text.split(","):
        term = raw.strip(" ")
        if not term:
            if raw and text.strip(" "):
                raise ValueError(f"empty term in selector {text!r}")
            continue
        m = _TERM.fullmatch(term)
        if not m or (m.group("neg") and m.group("op")):
            raise ValueError(
                f"'{term}' is not a valid selector term (use key, !key, key=v, key!=v)"
            )
        if m.group("op"):
            op = "=" if m.group("op") in ("=", "==") else "!="
            reqs.append(Requirement(m.group("key"), op, m.group("value") or ""))
        else:
            reqs.append(Requirement(m.group("key"), "!exists" if m.group("neg") else "exists"))
    return reqs


def selector_matches(reqs: list[Requirement], labels: dict) -> bool:
    return all(r.matches(labels) for r in reqs)
