"""Prices and team budgets in the admin: a price is added (never edited) with
``price.set``, its page lists its class's history, a bad one is refused by its field;
a team's budget is set with the team, what it spent shown read-only."""

from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from django.contrib.auth.models import Group
from django.urls import reverse
from django.utils import timezone

from fleet.models import Price, Team
from tests.admin.helpers import form_data
from tests.factories import grant, operator, staff_user

pytestmark = pytest.mark.django_db

ADD = "admin:fleet_price_add"


@pytest.fixture(autouse=True)
def _fast_passwords(settings):
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


def price_form(client, **changes):
    data = form_data(client.get(reverse(ADD)).content.decode())
    data.update({"gpu_class": "H100", "per_hour": "2.50", "currency": "EUR",
                 "effective_from_0": "2026-11-01", "effective_from_1": "00:00:00"})  # fmt: skip
    data.update(changes)
    return data


def test_an_operator_adds_a_price_and_its_page_shows_the_class_history(client):
    client.force_login(operator())
    now = timezone.now()
    Price.objects.create(gpu_class="H100", per_hour=Decimal("2.00"), currency="EUR",
                         effective_from=now - timedelta(days=60))  # fmt: skip

    added = client.post(reverse(ADD), price_form(client))

    assert added.status_code == 302
    new = Price.objects.get(per_hour=Decimal("2.50"))
    assert new.effective_from == datetime(2026, 11, 1, tzinfo=UTC)
    page = client.get(reverse("admin:fleet_price_change", args=[new.pk])).content.decode()
    # read-only: a price once set is history, and its class's other prices are listed
    assert 'name="per_hour"' not in page
    assert "History of its class" in page and "2.00 EUR" in page and "2.50 EUR" in page
    listing = client.get(reverse("admin:fleet_price_changelist")).content.decode()
    assert listing.count("icon-yes.svg") == 1  # one price in force per class


def test_a_price_of_a_class_and_date_priced_already_replaces_it_as_in_the_api(client):
    client.force_login(operator())
    client.post(reverse(ADD), price_form(client))

    again = client.post(reverse(ADD), price_form(client, per_hour="2.40"))

    assert again.status_code == 302
    assert list(Price.objects.values_list("per_hour", flat=True)) == [Decimal("2.40")]


def test_a_price_is_never_changed_or_deleted_in_the_admin(client):
    client.force_login(operator())
    price = Price.objects.create(gpu_class="H100", per_hour=1, effective_from=timezone.now())

    client.post(reverse("admin:fleet_price_change", args=[price.pk]), {"per_hour": "9"})
    deleted = client.post(reverse("admin:fleet_price_delete", args=[price.pk]), {"post": "yes"})

    assert deleted.status_code == 403
    assert Price.objects.get().per_hour == 1


def test_adding_a_price_needs_add_price(client):
    viewer = grant(staff_user("viewer"), "fleet.view_price")
    client.force_login(viewer)

    assert client.get(reverse(ADD)).status_code == 403
    assert client.post(reverse(ADD), {"gpu_class": "H100", "per_hour": "1",
                                      "currency": "EUR"}).status_code == 403  # fmt: skip
    assert not Price.objects.exists()


@pytest.mark.parametrize(
    ("change", "said"),
    [
        ({"per_hour": "-1"}, "greater than or equal to 0"),
        ({"currency": "eur"}, "three capital letters"),
        ({"effective_from_0": "someday"}, "Enter a valid date"),
    ],
)
def test_a_bad_price_is_refused_by_its_field(client, change, said):
    client.force_login(operator())

    answer = client.post(reverse(ADD), price_form(client, **change))

    assert answer.status_code == 200 and said in answer.content.decode()
    assert not Price.objects.exists()


def team_form(client, team, **changes):
    url = reverse("admin:fleet_team_change", args=[team.pk])
    data = form_data(client.get(url).content.decode())
    data.update(changes)
    return url, data


def test_a_team_budget_is_set_in_the_admin_and_what_it_spent_is_shown(client):
    research = Team.objects.create(name="research", group=Group.objects.create(name="research"))
    Team.objects.filter(pk=research.pk).update(spent_this_month=Decimal("412.5"))
    client.force_login(operator())

    url, data = team_form(client, research, budget_per_month="1000", budget_currency="EUR",
                          budget_warn_percent="90")  # fmt: skip
    saved = client.post(url, data)

    assert saved.status_code == 302
    research.refresh_from_db()
    assert (research.budget_per_month, research.budget_currency, research.budget_warn_percent,
            research.spent_this_month) == (Decimal(1000), "EUR", 90, Decimal("412.5"))  # fmt: skip
    assert "412.50 of 1,000.00 EUR" in client.get(url).content.decode()
    listing = client.get(reverse("admin:fleet_team_changelist")).content.decode()
    assert "412.50 of 1,000.00 EUR" in listing


def test_a_bad_budget_is_refused_and_without_change_team_the_page_is_read_only(client):
    research = Team.objects.create(name="research", group=Group.objects.create(name="research"))
    client.force_login(operator())
    url, data = team_form(client, research, budget_currency="eur")

    answer = client.post(url, data)

    assert answer.status_code == 200 and "three capital letters" in answer.content.decode()
    client.force_login(grant(staff_user("viewer"), "fleet.view_team"))
    data["budget_currency"], data["budget_per_month"] = "EUR", "5"
    assert client.post(url, data).status_code == 403
    research.refresh_from_db()
    assert (research.budget_per_month, research.budget_currency) == (None, "USD")


def test_cost_hours_are_read_only_and_a_member_sees_their_team_s_only(client):
    from tests.costs.surfaces import a_day

    teams = a_day()
    alice = grant(staff_user("alice"), "fleet.view_costhour")
    alice.groups.add(teams["vision"].group)
    client.force_login(alice)

    listing = client.get(reverse("admin:fleet_costhour_changelist")).content.decode()

    assert "vit-l" in listing and "llama-70b" not in listing and ">idle<" not in listing
    assert "12 cost hours" in listing
    client.force_login(operator())
    listing = client.get(reverse("admin:fleet_costhour_changelist")).content.decode()
    assert "60 cost hours" in listing  # 24 of llama, 12 of vit, 24 idle
    assert 'name="_selected_action"' not in listing  # no action: nothing to change
