import json
import urllib.request

import pytest
import websockets

from tests.factories import join_token, register_msg

pytestmark = [pytest.mark.live, pytest.mark.django_db(transaction=True)]


async def test_a_real_web_process_enrols_an_agent(live_web):
    from channels.db import database_sync_to_async

    from fleet.models import Node

    _, secret = await database_sync_to_async(join_token)()
    async with websockets.connect(
        live_web.ws_url, additional_headers={"Authorization": f"Bearer {secret}"}
    ) as ws:
        await ws.send(json.dumps(register_msg("cpu-01", gpus=[])))
        ack = json.loads(await ws.recv())
        assert ack["of"] == "register" and ack["credential"]
    node = await database_sync_to_async(Node.objects.get)(pk="cpu-01")
    assert node.memory_total_mb == 2063500
    with urllib.request.urlopen(live_web.url + "/admin/login/") as resp:
        assert resp.status == 200
