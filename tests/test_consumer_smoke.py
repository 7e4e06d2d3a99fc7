import json

import pytest
from channels.testing import WebsocketCommunicator

from fleet.models import Node
from llmgw_site.asgi import application
from tests.fleet_helpers import heartbeat_msg, join_token, register_msg

pytestmark = pytest.mark.django_db(transaction=True)


async def connect(secret):
    comm = WebsocketCommunicator(
        application, "/ws/agent/", headers=[(b"authorization", f"Bearer {secret}".encode())]
    )
    connected, code = await comm.connect()
    return comm, connected, code


async def test_enrol_register_heartbeat():
    from channels.db import database_sync_to_async

    _, secret = await database_sync_to_async(join_token)()
    comm, ok, _ = await connect(secret)
    assert ok
    await comm.send_to(text_data=json.dumps(register_msg()))
    ack = json.loads(await comm.receive_from())
    assert ack["type"] == "ack" and ack["credential"].startswith("lgn_")
    desired = json.loads(await comm.receive_from())
    assert desired["type"] == "desired"
    await comm.send_to(
        text_data=json.dumps(
            heartbeat_msg(
                load={
                    "cpu_percent": 12.5,
                    "cpu_count": 64,
                    "load1": 1,
                    "load5": 1,
                    "load15": 1,
                    "memory_used_bytes": 10**9,
                    "memory_available_bytes": 10**10,
                }
            )
        )
    )
    hb = json.loads(await comm.receive_from())
    assert hb["of"] == "heartbeat"
    node = await database_sync_to_async(Node.objects.get)(pk="gpu-01")
    assert node.connected and node.memory_total_mb == 2063500
    await comm.disconnect()
