"""``manage.py gpu clear`` and ``manage.py notice`` (docs/operations.md, "GPU faults and
notices"): the same service as every door, ``--as`` naming whose permission it is; a bad
GPU, time or reason is refused naming it, and changes nothing."""

import io

import pytest
from auditlog.models import LogEntry
from django.core.management import call_command
from django.core.management.base import CommandError

from fleet import audit
from fleet.models import GPU, Node
from tests.factories import add_node, grant, report_gpu_events, staff_user

pytestmark = pytest.mark.django_db


@pytest.fixture
def failed():
    """gpu-01's GPU 3 fell off the bus (XID 79)."""
    add_node("gpu-01")
    report_gpu_events("gpu-01", (3, "xid", 79))
    return GPU.objects.get(node_id="gpu-01", index=3)


def row(node_id="gpu-01", index=3) -> GPU:
    return GPU.objects.get(node_id=node_id, index=index)


def run(*argv) -> str:
    out = io.StringIO()
    call_command(*argv, stdout=out, stderr=io.StringIO())
    return out.getvalue()


def test_manage_gpu_clear_clears_with_its_reason_as_the_user_named(failed):
    staff = grant(staff_user("alice"), "fleet.drain_node")

    with audit.command_scope(["manage.py", "gpu"]):  # as manage.py runs it
        said = run("gpu", "clear", "gpu-01/3", "--reason", "swapped the board", "--as", "alice")

    assert said == "GPU gpu-01/gpu3 cleared by user 'alice': swapped the board; it is healthy now\n"
    assert row().fault == "healthy"
    entry = LogEntry.objects.get_for_object(row()).get()
    assert entry.actor == staff and entry.additional_data["door"] == "manage.py gpu"


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (("gpu-01/3", "--reason", " "), "say why the GPU is fine again"),
        (("gpu-01", "--reason", "x"), "'gpu-01' is not a GPU: name it NODE/INDEX, like node-1/0"),
        (("gpu-01/9", "--reason", "x"), "no GPU 9 on node 'gpu-01'"),
        (("gpu-01/3", "--reason", "x", "--as", "bob"), "user 'bob' may not clear GPU"),
    ],
)
def test_manage_gpu_clear_refuses_naming_the_problem(failed, argv, says):
    staff_user("bob")

    with pytest.raises(CommandError) as exc:
        run("gpu", "clear", *argv)

    assert says in str(exc.value)
    assert row().fault == "failed"


def test_manage_notice_gives_notice_and_refuses_a_bad_time(monkeypatch):
    add_node("gpu-01")

    with pytest.raises(CommandError, match="--in 'soon' is not a time ahead"):
        run("notice", "gpu-01", "--in", "soon", "--no-input")
    with pytest.raises(CommandError, match="a notice is 0 to 604800 s ahead, not 691200 s"):
        run("notice", "gpu-01", "--in", "8d", "--no-input")
    with pytest.raises(CommandError, match="no node 'gpu-99'"):
        run("notice", "gpu-99", "--in", "2m", "--no-input")
    assert Node.objects.get(pk="gpu-01").notice_deadline is None

    said = run("notice", "gpu-01", "--in", "2m", "--reason", "maintenance", "--no-input")

    assert said.startswith("node gpu-01 goes away in 120 s (operator: maintenance, said by ")
    node = Node.objects.get(pk="gpu-01")
    assert node.notice_deadline and node.draining and node.notice_reason == "maintenance"


def test_manage_notice_needs_the_permission_with_as():
    add_node("gpu-01")
    staff_user("bob")

    with pytest.raises(CommandError, match=r"needs the permission fleet.drain_node"):
        run("notice", "gpu-01", "--in", "60", "--no-input", "--as", "bob")

    assert Node.objects.get(pk="gpu-01").notice_deadline is None
