"""Setting a price: who may, what it checks, and the history it keeps."""

from decimal import Decimal

import pytest
from django.core.exceptions import ValidationError

from fleet.models import Price
from fleet.services import costs
from fleet.services.permissions import Refused
from tests.factories import grant, staff_user

from .helpers import at

pytestmark = pytest.mark.django_db


def test_setting_a_price_needs_fleet_add_price():
    ops = staff_user("ops")
    with pytest.raises(Refused) as refused:
        costs.set_price("H100", "2.00", "USD", at(0), actor=ops)
    assert str(refused.value) == (
        "user 'ops' may not set the price of GPU class 'H100': it needs the permission "
        "fleet.add_price"
    )
    assert not Price.objects.exists()
    costs.set_price("H100", "2.00", "USD", at(0), actor=grant(ops, "fleet.add_price"))
    assert costs.price_at("H100", at(1)).per_hour == Decimal("2.0000")


def test_a_price_of_the_same_class_and_date_replaces_it_and_others_are_history():
    costs.set_price("H100", "2.00", "USD", at(0))
    costs.set_price("H100", "2.20", "USD", at(0))
    costs.set_price("H100", "3.00", "USD", at(12))
    assert Price.objects.filter(gpu_class="H100").count() == 2
    assert costs.price_at("H100", at(11)).per_hour == Decimal("2.2000")
    assert costs.price_at("H100", at(12)).per_hour == Decimal("3.0000")
    assert costs.price_at("L4", at(12)) is None


@pytest.mark.parametrize(
    "per_hour,currency,field",
    [("-1", "USD", "per_hour"), ("two", "USD", "per_hour"), ("2", "usd", "currency")],
)
def test_a_bad_price_is_refused_naming_its_field(per_hour, currency, field):
    with pytest.raises(ValidationError) as refused:
        costs.set_price("H100", per_hour, currency, at(0))
    assert field in refused.value.message_dict
    assert not Price.objects.exists()
