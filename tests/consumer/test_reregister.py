"""A node registering again: after a control-plane restart the whole fleet does it at once.

A registration whose GPUs, fabrics, weights and installs are what the last one
wrote leaves those rows alone (inventory.register_node); what the node says now
must still be what operators and placement see.
"""

import pytest

from agentd import protocol
from fleet.models import GPU, LocalWeights, Node, NodeCredential, Storage
from fleet.services import inventory
from fleet.services.heartbeat import apply as heartbeat_apply
from tests.factories import H100_GPUS, heartbeat_msg, register_msg

pytestmark = pytest.mark.django_db


def register(node_id="gpu-01", **fields):
    return inventory.register_node(protocol.parse_agent_message(register_msg(node_id, **fields)))


def gpus_of(node_id="gpu-01"):
    return list(GPU.objects.filter(node_id=node_id).order_by("index"))


def heartbeat(node_id, **fields):
    from django.utils import timezone

    cred = NodeCredential.objects.filter(node_id=node_id).first()
    if cred is None:
        cred, _ = NodeCredential.issue(node=Node.objects.get(pk=node_id))
    hb = protocol.parse_agent_message(heartbeat_msg(**fields))
    heartbeat_apply.apply_heartbeats([(node_id, cred.pk, hb, timezone.now())])


def test_the_same_inventory_again_keeps_its_rows_and_takes_the_new_figures():
    register()
    before = [g.pk for g in gpus_of()]
    busy = [{**g, "memory_used_mb": 70_000 + g["index"], "temperature_c": 61} for g in H100_GPUS]

    # when: the node registers again, its engines now holding GPU memory, its disk fuller
    register(
        gpus=busy,
        storage=[{"path": "/var/lib/llmgw", "free_bytes": 5 * 10**11, "total_bytes": 2 * 10**12}],
    )

    # then: the figures are the new registration's; the rows were not rewritten
    gpus = gpus_of()
    assert [g.memory_used_mb for g in gpus] == [70_000 + i for i in range(8)]
    assert {g.temperature_c for g in gpus} == {61}
    assert [g.pk for g in gpus] == before
    assert list(Storage.objects.values_list("free_bytes", flat=True)) == [5 * 10**11]


def test_a_gpu_problem_a_heartbeat_reported_is_cleared_by_a_registration_without_it():
    # given: a heartbeat said GPU 3 has a problem
    register()
    heartbeat("gpu-01", new_problems=[{"gpu_index": 3, "problem": "xid 79"}])
    assert gpus_of()[3].problems == ["xid 79"]

    # when: the agent registers again (the machine was fixed) saying no problems,
    # the same inventory as its first registration
    register()

    # then: the registration is the truth
    assert [g.problems for g in gpus_of()] == [[]] * 8


def test_changed_weights_are_written():
    register()
    register(weights=[{"path": "/models/llama", "size_bytes": 7 * 10**9}])
    assert list(LocalWeights.objects.values_list("path", flat=True)) == ["/models/llama"]


def test_weights_a_heartbeat_changed_are_replaced_by_a_registration_saying_the_first_ones():
    register()
    heartbeat("gpu-01", weights_changed=True, weights=[])
    assert not LocalWeights.objects.exists()

    register()

    assert list(LocalWeights.objects.values_list("path", flat=True)) == ["/models/qwen"]
