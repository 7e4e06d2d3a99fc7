"""A catalog file's ``prices:`` through ``apply -f``: set, unchanged, changed; refused
without ``price.set`` with nothing applied; each bad entry named, nothing applied."""

from decimal import Decimal

import pytest

from fleet.models import Model, Price
from fleet.services import catalog, permissions
from tests.factories import grant, staff_user

pytestmark = pytest.mark.django_db

PRICES = """\
prices:
  - gpu_class: H100
    per_hour: 2.50
    currency: EUR
    effective_from: 2026-11-01
  - gpu_class: ""
    per_hour: 0.40
    currency: EUR
    effective_from: 2026-11-01T12:00:00Z
"""


def test_a_catalog_s_prices_are_set_then_unchanged_then_changed():
    first = catalog.apply(PRICES)

    assert first.changes == [
        "price of GPU class 'H100' from 2026-11-01 00:00 UTC: 2.5 EUR/h",
        "price of a CPU-only node from 2026-11-01 12:00 UTC: 0.4 EUR/h",
    ]
    assert catalog.apply(PRICES).changes == []
    again = catalog.apply(PRICES.replace("2.50", "2.75"))
    assert again.changes == [
        "price of GPU class 'H100' from 2026-11-01 00:00 UTC: 2.5000 EUR → 2.75 EUR/h"
    ]
    assert sorted(Price.objects.values_list("gpu_class", "per_hour")) == [
        ("", Decimal("0.4000")), ("H100", Decimal("2.7500"))]  # fmt: skip


def test_a_catalog_s_prices_need_add_price_and_nothing_is_applied_without_it():
    ops = grant(staff_user("ops"), "fleet.add_model", "fleet.add_engineprofile")
    text = (
        PRICES
        + """\
models:
  - name: fresh
    profiles:
      - name: cpu
        engine: llamacpp
        model_path: /models/x.gguf
"""
    )

    with pytest.raises(permissions.Refused, match=r"fleet\.add_price \(prices\[0\]"):
        catalog.apply(text, actor=ops)

    assert not Price.objects.exists()
    assert not Model.objects.exists()


def test_a_catalog_s_bad_prices_are_each_named_and_nothing_is_applied():
    text = """\
prices:
  - gpu_class: H100
    per_hour: 2.50
  - gpu_class: A100
    per_hour: cheap
    effective_from: 2026-11-01
    colour: green
  - gpu_class: L4
    per_hour: 1
    currency: euro
    effective_from: someday
  - gpu_class: L40S
    per_hour: -1
    effective_from: 2026-11-01
"""

    with pytest.raises(catalog.CatalogError) as refused:
        catalog.apply(text)

    assert refused.value.errors == [
        "prices[0].effective_from: required",
        "prices[1]: unknown field 'colour'",
    ]
    dated = "    per_hour: 2.50\n    effective_from: 2026-11-01\n"
    text = text.replace("    colour: green\n", "").replace("    per_hour: 2.50\n", dated)
    with pytest.raises(catalog.CatalogError) as refused:
        catalog.apply(text)
    assert refused.value.errors == [
        "prices[1] (GPU class 'A100').per_hour: 'cheap' is not a number",
        "prices[2] (GPU class 'L4').effective_from: 'someday' is not a date (2026-01-01) "
        "or an ISO 8601 time",
        "prices[3] (GPU class 'L40S').per_hour: Ensure this value is greater than or equal to 0.",
    ]
    assert not Price.objects.exists()
