"""A change of a node's desired set reaches its socket and every gateway."""

import pytest
from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer

from fleet.models import Node
from fleet.services import desired, doorbells

pytestmark = pytest.mark.django_db(transaction=True)


def test_bump_desired_rings_the_node_and_the_gateways():
    # given a node socket and a gateway listening on the channel layer
    Node.objects.create(id="gpu-01")
    layer = get_channel_layer()
    node_ch = async_to_sync(layer.new_channel)()
    gw_ch = async_to_sync(layer.new_channel)()
    async_to_sync(layer.group_add)(doorbells.node_group("gpu-01"), node_ch)
    async_to_sync(layer.group_add)(doorbells.GATEWAYS_GROUP, gw_ch)

    # when the desired set changes (say a shard is told to drain)
    desired.bump_desired(["gpu-01"])

    # then the node's version moved, its socket is rung, and the gateways reload
    # their routes at once rather than at their next periodic refresh
    assert Node.objects.get(pk="gpu-01").desired_version == 1
    assert async_to_sync(layer.receive)(node_ch)["type"] == "node.doorbell"
    assert async_to_sync(layer.receive)(gw_ch) == {
        "type": doorbells.GATEWAY_REFRESH,
        "what": "routes",
    }
