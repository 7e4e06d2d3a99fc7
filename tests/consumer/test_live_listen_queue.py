"""An agent's handshake that sat in the kernel's listen queue, over a real web process.

After a restart the whole fleet knocks at once and the web process drains its
listen queue no faster than it registers; an agent at the tail has used most of
its 10 s handshake wait by the time the process reads its request. Such a
handshake is answered at once with 503 and ``Retry-After`` (llmgw_site.serve,
``_agent_turned_away``) rather than taken. Here the queue is made by stopping the
process (SIGSTOP) while an agent knocks: the kernel completes the connection and
holds the request, as it does for a process too busy to accept.
"""

import asyncio
import json
import signal
import urllib.request

import pytest
import websockets
from websockets.exceptions import InvalidStatus

from fleet.models import Node, NodeCredential
from fleet.services import admission
from tests.consumer.helpers import db
from tests.factories import register_msg

pytestmark = [pytest.mark.live, pytest.mark.django_db(transaction=True)]


def enrolled(node_id: str) -> str:
    node = Node.objects.create(pk=node_id)
    return NodeCredential.issue(node=node)[1]


def turned_away(server, why: str) -> float:
    text = urllib.request.urlopen(f"{server.url}/metrics", timeout=10).read().decode()
    line = f'llmgw_agent_handshakes_turned_away_total{{why="{why}"}} '
    return sum(float(x[len(line) :]) for x in text.splitlines() if x.startswith(line))


def knock(server, secret: str):
    return websockets.connect(
        server.ws_url, additional_headers={"Authorization": f"Bearer {secret}"}, open_timeout=30
    )


async def test_a_handshake_late_out_of_the_listen_queue_is_told_when_to_come_back(live_web):
    # given an enrolled node, and a web process too busy to accept for a while
    secret = await db(enrolled)("gpu-late")
    live_web.proc.send_signal(signal.SIGSTOP)
    try:
        # when the node's agent knocks, and its request waits in the kernel past LATE_S
        knocking = asyncio.ensure_future(knock(live_web, secret))
        await asyncio.sleep(admission.LATE_S + 1)
    finally:
        live_web.proc.send_signal(signal.SIGCONT)

    # then it is answered 503 with a time to come back, naming why
    with pytest.raises(InvalidStatus) as refused:
        await knocking
    response = refused.value.response
    assert response.status_code == 503
    assert 1 <= int(response.headers["Retry-After"]) <= admission.RETRY_AFTER_MAX_S
    assert b"s to be read; retry after" in response.body
    assert await asyncio.to_thread(turned_away, live_web, "late") == 1
    assert "agents told to come back: 1 since the last line" in live_web.output()
    # and nothing of it was written: the node is not connected
    assert not await db(lambda: Node.objects.get(pk="gpu-late").connected)()

    # and coming back on time, it is taken as any other
    async with knock(live_web, secret) as ws:
        await ws.send(json.dumps(register_msg("gpu-late")))
        kinds = set()
        while "desired" not in kinds:
            kinds.add(json.loads(await asyncio.wait_for(ws.recv(), 10))["type"])
    assert "ack" in kinds
    assert await asyncio.to_thread(turned_away, live_web, "late") == 1
