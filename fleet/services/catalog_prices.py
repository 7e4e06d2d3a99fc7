"""A catalog file's ``prices:``: what an hour of each GPU class costs, from a date on.

::

    prices:
      - gpu_class: H100           # a substring of the GPU's name; "" for a CPU-only node
        per_hour: 2.50
        currency: EUR             # optional: LLMGW_COST_CURRENCY
        effective_from: 2026-01-01  # a date (midnight UTC) or a time; required

A price is history: each entry is the price of its class from its date on,
set through ``costs.set_price`` (an entry of a class and date already priced
replaces that price; prices the file does not name are left alone, so an older
price stays in force for the hours before the new one). ``effective_from`` is
required because "from now" would make a new price each time the file is
applied. Each change needs ``price.set`` (fleet.services.permissions), asked
with the rest of the file's changes by ``catalog.apply``.
"""

from __future__ import annotations

from datetime import UTC, date, datetime, time
from decimal import Decimal, InvalidOperation

from django.core.exceptions import ValidationError
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from fleet.conf import fleet_settings
from fleet.models import Price

from . import costs, permissions

PRICE_KEYS = {"gpu_class", "per_hour", "currency", "effective_from"}


def check(entries) -> list[str]:
    """The shape of the file's ``prices``: a list of mappings with known keys, each class
    priced once per date."""
    if not isinstance(entries, list):
        return ["prices: must be a list of {gpu_class, per_hour, currency, effective_from}"]
    errors, seen = [], set()
    for i, entry in enumerate(entries):
        where = f"prices[{i}]"
        if not isinstance(entry, dict):
            errors.append(f"{where}: must be a mapping")
            continue
        errors += [f"{where}: unknown field '{k}'" for k in sorted(set(entry) - PRICE_KEYS)]
        for key in ("gpu_class", "per_hour", "effective_from"):
            if key not in entry:
                errors.append(f"{where}.{key}: required")
        if not isinstance(entry.get("gpu_class", ""), str):
            errors.append(f"{where}.gpu_class: must be text ('' for a CPU-only node)")
        key = (entry.get("gpu_class"), str(entry.get("effective_from")))
        if key in seen:
            errors.append(f"{where}: {_named(key[0])} is priced twice from {key[1]}")
        seen.add(key)
    return errors


def when(value) -> datetime:
    """A file's ``effective_from``: a date is its midnight UTC; a time without a zone, UTC.
    ValueError saying what is wrong."""
    if isinstance(value, datetime):
        found = value
    elif isinstance(value, date):
        found = datetime.combine(value, time.min)
    elif isinstance(value, str):
        try:
            found = parse_datetime(value.strip())
        except ValueError:
            found = None
        if found is None:
            raise ValueError(f"'{value}' is not a date (2026-01-01) or an ISO 8601 time")
    else:
        raise ValueError(f"{value!r} is not a date (2026-01-01) or an ISO 8601 time")
    return found if timezone.is_aware(found) else found.replace(tzinfo=UTC)


def apply(entries, result, actor) -> list[str]:
    """Set each price of the file; records what changed, and what needs ``price.set``, on
    ``result`` (a ``catalog.ApplyResult``). Returns the problems, each naming its field."""
    errors = []
    # The catalog asks for every permission at once when the file is done, and rolls
    # everything back if any is missing: set as the system until then, as the actor
    # once they may (so the price's log line names them).
    setter = actor if permissions.allowed(actor, "price.set") else permissions.SYSTEM
    fallback = fleet_settings().cost_currency
    for i, entry in enumerate(entries):
        gpu_class = entry["gpu_class"]
        where = f"prices[{i}] ({_named(gpu_class)})"
        try:
            start = when(entry["effective_from"])
        except ValueError as exc:
            errors.append(f"{where}.effective_from: {exc}")
            continue
        try:
            per_hour = Decimal(str(entry["per_hour"]))
        except InvalidOperation:
            errors.append(f"{where}.per_hour: '{entry['per_hour']}' is not a number")
            continue
        currency = entry.get("currency") or fallback
        shown = f"price of {_named(gpu_class)} from {start:%Y-%m-%d %H:%M} UTC"
        old = Price.objects.filter(gpu_class=gpu_class, effective_from=start).first()
        if old is not None and (old.per_hour, old.currency) == (per_hour, currency):
            result.unchanged.append(shown)
            continue
        try:
            costs.set_price(gpu_class, per_hour, currency, start, actor=setter)
        except ValidationError as exc:
            errors += [f"{where}.{f}: {m}" for f, ms in _by_field(exc).items() for m in ms]
            continue
        result.need("price.set", where)
        if old is None:
            result.changes.append(f"{shown}: {per_hour} {currency}/h")
        else:
            result.changes.append(
                f"{shown}: {old.per_hour} {old.currency} → {per_hour} {currency}/h"
            )
    return errors


def _by_field(exc: ValidationError) -> dict:
    return exc.message_dict if hasattr(exc, "error_dict") else {"__all__": exc.messages}


def _named(gpu_class) -> str:
    return f"GPU class '{gpu_class}'" if gpu_class else "a CPU-only node"
