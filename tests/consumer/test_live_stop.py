"""A web process stopped cleanly (SIGTERM) under connected agents, over a real server.

Every agent hears 1012 ("service restart") and comes back elsewhere; every node
the process held is marked disconnected before it exits, as the console and
the reconciler read it. The sockets all close at once, so their nodes are
marked in batches (``socket_db.node_batcher("disconnects")``); what batching
saves shows only at thousands of sockets, in bench/agents.py --restart
(docs/benchmarks.md, Agent sockets); here, that the batched path leaves
every node right.
"""

import asyncio
import json
import signal

import pytest
import websockets
from websockets.exceptions import ConnectionClosed

from fleet.models import Node, NodeCredential
from tests.consumer.helpers import db
from tests.factories import register_msg

pytestmark = [pytest.mark.live, pytest.mark.django_db(transaction=True)]

AGENTS = 40
# "Service restart" (RFC 6455): uvicorn closes every socket so on a clean stop.
SERVICE_RESTART = 1012


def enrolled(node_id: str) -> str:
    """A node enrolled earlier, with its credential's secret."""
    node = Node.objects.create(pk=node_id)
    return NodeCredential.issue(node=node)[1]


async def registered(server, node_id: str, secret: str):
    ws = await websockets.connect(
        server.ws_url, additional_headers={"Authorization": f"Bearer {secret}"}, open_timeout=10
    )
    await ws.send(json.dumps(register_msg(node_id)))
    while json.loads(await asyncio.wait_for(ws.recv(), 10))["type"] != "desired":
        pass
    return ws


async def close_code(ws) -> int:
    with pytest.raises(ConnectionClosed) as info:
        while True:
            await asyncio.wait_for(ws.recv(), 20)
    return info.value.rcvd.code if info.value.rcvd else 1006


async def test_a_clean_stop_tells_every_agent_and_marks_every_node_disconnected(live_web):
    # given a web process holding 40 registered agents
    nodes = [f"gpu-{i:02d}" for i in range(AGENTS)]
    secrets = [await db(enrolled)(n) for n in nodes]
    sockets = await asyncio.gather(
        *(registered(live_web, n, s) for n, s in zip(nodes, secrets, strict=True))
    )
    assert await db(Node.objects.filter(connected=True).count)() == AGENTS

    # when it is stopped as a supervisor stops it
    live_web.proc.terminate()

    # then every agent is told to come back, and the process exits by itself
    codes = await asyncio.gather(*(close_code(ws) for ws in sockets))
    assert set(codes) == {SERVICE_RESTART}
    # (uvicorn ends a clean stop by raising the signal again: the exit status says SIGTERM)
    assert await asyncio.to_thread(live_web.proc.wait, 30) == -signal.SIGTERM
    # with no node left marked connected, or holding the closed socket's channel
    left = await db(
        lambda: list(Node.objects.filter(connected=True).values_list("pk", flat=True))
    )()
    assert left == []
    assert await db(Node.objects.exclude(channel_name="").count)() == 0
    log = live_web.output()
    assert "Application shutdown complete" in log
    assert all(f"agent stream closed node={n} code=1012" in log for n in nodes)
