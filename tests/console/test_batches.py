"""The Batches page and a batch's: progress, why paused, whose, and only one's own teams'."""

import re
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from fleet.models import Batch, BatchFile, BatchLine, BatchStatus
from fleet.services.console.batches import BATCHES_SHOWN
from tests.batches.helpers import key, team
from tests.factories import grant, operator, staff_user

pytestmark = pytest.mark.django_db

BATCHES = reverse("console:batches")
FRAGMENT = reverse("console:batches-fragment")


def input_file(api_key, models=("qwen",), lines=20) -> BatchFile:
    return BatchFile.objects.create(
        api_key=api_key,
        team_id=api_key.team_id,
        purpose="batch",
        filename="questions.jsonl",
        size_bytes=100 * lines,
        lines=lines,
        storage_name="unused",
        summary={"models": {m: i + 1 for i, m in enumerate(models)}},
    )


def batch(api_key, *, total=20, completed=0, failed=0, age_min=0, **fields) -> Batch:
    """A batch of ``api_key``'s as the runner leaves it, created ``age_min`` minutes ago."""
    now = timezone.now()
    row = Batch.objects.create(
        api_key=api_key,
        team_id=api_key.team_id,
        endpoint="/v1/chat/completions",
        input_file=fields.pop("input_file", None) or input_file(api_key, lines=total),
        total=total,
        completed=completed,
        failed=failed,
        expires_at=now + timedelta(hours=24) - timedelta(minutes=age_min),
        **fields,
    )
    Batch.objects.filter(pk=row.pk).update(created_at=now - timedelta(minutes=age_min))
    return row


def row(html: str, batch_id: str) -> str:
    """The list's row of one batch."""
    return html.split(f'data-batch-id="{batch_id}"', 1)[1].split("</tr>", 1)[0]


@pytest.fixture
def two_teams():
    """Teams research and vision, a batch each, and alice, a member of research with the
    permission to view batches."""
    research, vision = team("research"), team("vision")
    ours = batch(key("r-key", research)[0], completed=14, failed=1, status=BatchStatus.IN_PROGRESS)
    theirs = batch(key("v-key", vision)[0], completed=3, status=BatchStatus.IN_PROGRESS)
    alice = staff_user("alice")
    alice.groups.add(research.group)
    alice = grant(alice, "fleet.view_batch", "fleet.view_batchfile", "fleet.view_batchline")
    return ours, theirs, alice


def test_staff_see_every_batch_newest_first_with_its_progress(client):
    research = team("research")
    running = batch(
        key("nightly", research)[0],
        completed=14,
        failed=1,
        status=BatchStatus.IN_PROGRESS,
        paused="model 'qwen': 3 interactive requests waiting",
        age_min=5,
    )
    done = batch(
        key("adhoc")[0],  # a key of no team
        total=4,
        completed=4,
        status=BatchStatus.COMPLETED,
        output_file_id="file-out1",
        completed_at=timezone.now(),
        age_min=60,
    )
    client.force_login(operator())

    html = client.get(BATCHES).content.decode()

    assert html.index(running.id) < html.index(done.id)
    line = row(html, running.id)
    assert "15 of 20 answered (1 failed)" in line
    assert 'data-percent="75"' in line
    assert "team research" in line and "qwen" in line and "/v1/chat/completions" in line
    assert "paused: model &#x27;qwen&#x27;: 3 interactive requests waiting" in line
    assert reverse("console:batch", args=[running.id]) in line
    line = row(html, done.id)
    assert "4 of 4 answered" in line and "failed)" not in line
    assert "key adhoc" in line and "file-out1" in line
    assert "paused" not in line


def test_the_list_refreshes_progress_in_place_from_its_fragment(client):
    b = batch(key("nightly", team("research"))[0], status=BatchStatus.IN_PROGRESS)
    client.force_login(operator())

    html = client.get(BATCHES + "?status=unfinished").content.decode()
    assert f'data-refresh-url="{FRAGMENT}?status=unfinished"' in html
    Batch.objects.filter(pk=b.pk).update(completed=9, failed=2)  # the runner answers lines
    body = client.get(FRAGMENT + "?status=unfinished").content.decode()

    assert "<html" not in body
    assert "11 of 20 answered (2 failed)" in row(body, b.id)


def test_the_status_filter_and_the_search(client):
    research = team("research")
    running = batch(key("nightly", research)[0], status=BatchStatus.IN_PROGRESS)
    failed = batch(key("adhoc", research)[0], status=BatchStatus.FAILED)
    client.force_login(operator())

    unfinished = client.get(FRAGMENT + "?status=unfinished").content.decode()
    only_failed = client.get(FRAGMENT + "?status=failed").content.decode()
    by_key = client.get(FRAGMENT + "?q=nightly").content.decode()

    assert running.id in unfinished and failed.id not in unfinished
    assert failed.id in only_failed and running.id not in only_failed
    assert running.id in by_key and failed.id not in by_key


def test_a_member_sees_their_team_s_batches_and_not_another_team_s(client, two_teams):
    ours, theirs, alice = two_teams
    client.force_login(alice)

    html = client.get(BATCHES).content.decode()
    assert ours.id in html and "15 of 20 answered (1 failed)" in html
    assert theirs.id not in html and "team vision" not in html
    assert theirs.id not in client.get(FRAGMENT + "?q=batch").content.decode()
    # Another team's batch is as if there were none: its page and fragment are 404s.
    assert client.get(reverse("console:batch", args=[ours.id])).status_code == 200
    assert client.get(reverse("console:batch", args=[theirs.id])).status_code == 404
    assert client.get(reverse("console:batch-fragment", args=[theirs.id])).status_code == 404
    # The admin's lists keep to the same teams.
    admin_list = client.get(reverse("admin:fleet_batch_changelist")).content.decode()
    assert ours.id in admin_list and theirs.id not in admin_list
    files = client.get(reverse("admin:fleet_batchfile_changelist")).content.decode()
    assert ours.input_file_id in files and theirs.input_file_id not in files
    BatchLine.objects.create(batch=ours, line=1, custom_id="ours-1", status_code=200)
    BatchLine.objects.create(batch=theirs, line=1, custom_id="theirs-1", status_code=200)
    lines = client.get(reverse("admin:fleet_batchline_changelist")).content.decode()
    assert "ours-1" in lines and "theirs-1" not in lines


def test_someone_in_no_team_sees_only_their_own_keys_batches(client, two_teams):
    _, theirs, _ = two_teams
    bob = grant(staff_user("bob"), "fleet.view_batch")
    mine = batch(_key_of(bob))
    someone_elses = batch(key("other")[0])
    client.force_login(bob)

    html = client.get(BATCHES).content.decode()

    assert mine.id in html
    assert someone_elses.id not in html and theirs.id not in html


def _key_of(user):
    from fleet.models import ApiKey

    api_key, _ = ApiKey.issue(name=f"{user.username}-key", scope="inference", user=user)
    return api_key


def test_anonymous_users_are_sent_to_log_in(client):
    b = batch(key("nightly")[0])

    page = client.get(BATCHES)
    assert page.status_code == 302 and page.url.startswith(reverse("admin:login"))
    detail = client.get(reverse("console:batch", args=[b.id]))
    assert detail.status_code == 302 and detail.url.startswith(reverse("admin:login"))
    # What scripts fetch answers 403, not a login page in the middle of a table.
    assert client.get(FRAGMENT).status_code == 403
    assert client.get(reverse("console:batch-fragment", args=[b.id])).status_code == 403


def test_staff_without_the_view_permission_are_refused_and_not_shown_the_link(client):
    client.force_login(staff_user("guest"))
    assert client.get(BATCHES).status_code == 403
    assert client.get(FRAGMENT).status_code == 403
    assert 'id="nav-batches"' not in client.get(reverse("admin:index")).content.decode()

    client.force_login(grant(staff_user("viewer"), "fleet.view_batch"))
    index = client.get(reverse("admin:index")).content.decode()
    assert f'id="nav-batches" href="{BATCHES}"' in index
    assert 'id="nav-cluster"' not in index  # that one needs fleet.view_node


def test_the_list_is_bounded_and_says_how_many_there_are(client):
    api_key = key("bulk", team("research"))[0]
    source = input_file(api_key)
    now = timezone.now()
    Batch.objects.bulk_create(
        Batch(
            api_key=api_key,
            team_id=api_key.team_id,
            endpoint="/v1/chat/completions",
            input_file=source,
            total=20,
            expires_at=now,
        )
        for _ in range(BATCHES_SHOWN + 7)
    )
    client.force_login(operator())

    html = client.get(BATCHES).content.decode()

    assert html.count('class="batch-row') == BATCHES_SHOWN
    assert f'data-count="{BATCHES_SHOWN + 7}"' in html
    assert f"The newest {BATCHES_SHOWN} of {BATCHES_SHOWN + 7}" in html


def _queries(client, url) -> int:
    with CaptureQueriesContext(connection) as queries:
        assert client.get(url).status_code == 200
    return len(queries)


def test_the_queries_do_not_grow_with_the_batches(client, two_teams):
    _, _, alice = two_teams
    research_key = Batch.objects.get(team__name="research").api_key
    client.force_login(alice)
    small = (_queries(client, BATCHES), _queries(client, FRAGMENT))
    for _ in range(30):
        batch(research_key)
    large = (_queries(client, BATCHES), _queries(client, FRAGMENT))
    assert small == large


def test_a_batch_s_page_shows_its_metadata_errors_and_failed_lines(client):
    api_key = key("nightly", team("research"))[0]
    running = batch(
        api_key,
        completed=1,
        failed=1,
        status=BatchStatus.IN_PROGRESS,
        in_progress_at=timezone.now(),
        metadata={"job": "<b>evals</b>"},
    )
    BatchLine.objects.create(batch=running, line=1, custom_id="q-1", status_code=200, body="{}")
    BatchLine.objects.create(
        batch=running,
        line=2,
        custom_id="q-2",
        status_code=400,
        body='{"error": {"message": "max_tokens is too large"}}',
    )
    rejected = batch(
        api_key,
        status=BatchStatus.FAILED,
        failed_at=timezone.now(),
        errors={
            "object": "list",
            "data": [
                {
                    "code": "model_not_found",
                    "message": "model 'llama' does not exist",
                    "param": "body.model",
                    "line": 3,
                }
            ],
        },
    )
    client.force_login(operator())

    html = client.get(reverse("console:batch", args=[running.id])).content.decode()
    assert "2 of 20 answered (1 failed)" in html
    assert "&lt;b&gt;evals&lt;/b&gt;" in html and "<b>evals</b>" not in html
    failed = html.split('id="batch-failed-lines"')[1].split("</table>")[0]
    assert "q-2" in failed and "max_tokens is too large" in failed and "q-1" not in failed
    fragment = reverse("console:batch-fragment", args=[running.id])
    assert f'data-refresh-url="{fragment}"' in html

    html = client.get(reverse("console:batch", args=[rejected.id])).content.decode()
    errors = html.split('id="batch-validation-errors"')[1].split("</table>")[0]
    assert "model_not_found" in errors and "model &#x27;llama&#x27; does not exist" in errors
    assert "data-refresh-url" not in html.split('id="batch-body"')[1].split(">")[0]


def test_a_batch_page_links_to_the_batch_in_the_admin_whatever_its_id(client):
    # "batch_23…" read back unquoted is "batch#…": the admin quotes its ids in links
    shown = batch(key("nightly", team("research"))[0], id="batch_23" + "a" * 22)
    client.force_login(operator())

    html = client.get(reverse("console:batch", args=[shown.id])).content.decode()
    link = re.search(r'href="([^"]+)">batch_23a+ in the admin', html).group(1)

    page = client.get(link)
    assert page.status_code == 200 and shown.id in page.content.decode()
