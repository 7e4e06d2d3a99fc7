"""A node's page lists the weights on its disks: size, source, last use, pinned, what uses them."""

import re
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from fleet.models import LocalWeights
from tests.factories import WEIGHTS_DIR, add_node, grant, node_with_weights, operator, staff_user

pytestmark = pytest.mark.django_db

W = WEIGHTS_DIR
OLD_USE = datetime(2026, 11, 28, 9, 30, tzinfo=UTC)


def node_url(name="node", node_id="n1"):
    return reverse(f"console:{name}", args=[node_id])


def weights_row(html: str, path: str) -> str:
    m = re.search(rf'<tr class="weights-row[^"]*" data-path="{re.escape(path)}">(.*?)</tr>', html)
    assert m, f"no weights row for {path}"
    return m.group(1)


def cell(row: str, name: str) -> str:
    m = re.search(rf'<td class="weights-{name}[^"]*">(.*?)</td>', row)
    assert m, f"no {name} cell in {row}"
    return m.group(1)


@pytest.fixture
def n1():
    """n1 serves tiny from tiny.gguf, and holds an old model nothing needs, pinned."""
    shard = node_with_weights("n1")
    LocalWeights.objects.filter(path=f"{W}/old").update(
        unused_since=OLD_USE, pinned=True, source="hf://org/old@a1b2c3d"
    )
    return shard


def test_the_node_page_lists_each_entry_with_what_uses_it(client, n1):
    client.force_login(operator())

    html = client.get(node_url()).content.decode()

    assert 'id="node-weights"' in html
    tiny = weights_row(html, f"{W}/tiny.gguf")
    assert cell(tiny, "size") == "1.9 GiB"
    assert cell(tiny, "source") == "-"  # it was on the disk already
    assert cell(tiny, "last-used") == "in use now"
    assert cell(tiny, "pinned") == "no"
    assert cell(tiny, "in-use-by") == f"tiny ({n1.pk})"
    old = weights_row(html, f"{W}/old")
    assert cell(old, "size") == "6.5 GiB"
    assert cell(old, "source") == "hf://org/old@a1b2c3d"
    assert cell(old, "last-used") == timezone.localtime(OLD_USE).strftime("%Y-%m-%d %H:%M")
    assert cell(old, "pinned") == "yes"
    assert cell(old, "in-use-by") == "-"
    # pinning and removing are in the admin, a click away
    assert f"{reverse('admin:fleet_localweights_changelist')}?node__id__exact=n1" in html
    # The same in the part of the page that refreshes itself.
    body = client.get(node_url("node-fragment")).content.decode()
    assert cell(weights_row(body, f"{W}/old"), "source") == "hf://org/old@a1b2c3d"


def test_a_removal_under_way_and_what_the_node_kept_are_shown(client, n1):
    LocalWeights.objects.filter(path=f"{W}/old").update(removal="sent")
    LocalWeights.objects.filter(path=f"{W}/tiny.gguf").update(
        kept_reason="an engine has a file open in it"
    )
    client.force_login(operator())

    html = client.get(node_url()).content.decode()

    assert cell(weights_row(html, f"{W}/old"), "removal") == "sent"
    kept = cell(weights_row(html, f"{W}/tiny.gguf"), "removal")
    assert kept == "kept: an engine has a file open in it"


def test_a_node_with_no_weights_says_so(client):
    add_node("n1")
    client.force_login(operator())

    html = client.get(node_url()).content.decode()

    table = html[html.index('id="node-weights"') :]
    assert table.index("none reported") < table.index("</table>")


def test_weights_are_shown_only_with_the_permission_to_view_them(client, n1):
    # given: staff who may view nodes, not weights
    user = grant(staff_user("viewer"), "fleet.view_node")
    client.force_login(user)

    html = client.get(node_url()).content.decode()
    body = client.get(node_url("node-fragment")).content.decode()

    # then: the page says what it would take, and names no entry
    for page in (html, body):
        assert "Weights are shown to staff with the permission fleet.view_localweights" in page
        assert f"{W}/old" not in page and "weights-row" not in page

    # when: they may view weights too
    client.force_login(grant(user, "fleet.view_localweights"))

    # then: the entries are there
    assert f'data-path="{W}/old"' in client.get(node_url()).content.decode()


def test_the_weights_cost_the_page_the_same_queries_however_many_there_are(client, n1):
    client.force_login(operator())

    def queries() -> int:
        with CaptureQueriesContext(connection) as ctx:
            assert client.get(node_url()).status_code == 200
        return len(ctx.captured_queries)

    few = queries()
    LocalWeights.objects.bulk_create(
        LocalWeights(
            node_id="n1",
            path=f"{W}/extra-{i}",
            size_bytes=10**9,
            unused_since=timezone.now() - timedelta(hours=i),
        )
        for i in range(20)
    )
    many = queries()

    assert few == many
