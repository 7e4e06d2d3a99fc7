"""The node page through a real web process: the logs panel's request reaches the agent's
socket in the same process and the answer comes back escaped; a heartbeat's load,
applied by its heartbeat writer, is a point on the charts."""

import asyncio
import json
import urllib.request

import pytest
from django.test import Client

from tests.consumer.helpers import run_closing_connections
from tests.consumer.test_live_agent_socket import connect, enrol, recv
from tests.factories import heartbeat_msg, operator, register_msg

pytestmark = [pytest.mark.live, pytest.mark.django_db(transaction=True)]


def session_cookie() -> str:
    client = Client()
    client.force_login(operator())
    return f"sessionid={client.cookies['sessionid'].value}"


def get(url: str, cookie: str) -> tuple[int, str]:
    req = urllib.request.Request(url, headers={"Cookie": cookie})
    with urllib.request.urlopen(req, timeout=20) as resp:
        return resp.status, resp.read().decode()


async def test_the_logs_panel_asks_the_agent_on_the_same_web_process(live_web):
    server = live_web
    credential = await enrol(server, "gpu-01")
    cookie = await asyncio.to_thread(run_closing_connections, session_cookie)
    url = f"{server.url}/admin/cluster/nodes/gpu-01/logs/?source=agent&lines=2"

    async with connect(server, credential) as ws:
        await ws.send(json.dumps(register_msg("gpu-01")))
        await recv(ws, "ack")
        await recv(ws, "desired")

        # when: the operator presses Show while the agent is connected
        page = asyncio.ensure_future(asyncio.to_thread(get, url, cookie))
        request = await recv(ws, "logs_request", timeout=10)
        assert (request["source"], request["lines"]) == ("agent", 2)
        await ws.send(
            json.dumps(
                {
                    "type": "logs_reply",
                    "v": 1,
                    "request_id": request["request_id"],
                    "lines": ["engine up", "<script>alert(1)</script>"],
                    "sources": ["agent"],
                }
            )
        )
        status, html = await asyncio.wait_for(page, 20)

    # then: the lines, as text
    assert status == 200
    assert "engine up" in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert "<script>" not in html


LOAD = {
    "cpu_percent": 42.0,
    "cpu_count": 16,
    "load1": 1.5,
    "load5": 1.0,
    "load15": 0.5,
    "memory_used_bytes": 8 * 2**30,
    "memory_available_bytes": 24 * 2**30,
    "shards": [],
}


async def test_a_heartbeats_load_is_a_point_on_the_nodes_charts(live_web):
    server = live_web
    credential = await enrol(server, "gpu-01")
    cookie = await asyncio.to_thread(run_closing_connections, session_cookie)

    async with connect(server, credential) as ws:
        await ws.send(json.dumps(register_msg("gpu-01")))
        await recv(ws, "ack")
        await recv(ws, "desired")
        await ws.send(json.dumps(heartbeat_msg(seq=1, load=LOAD)))
        assert (await recv(ws, "ack"))["seq"] == 1  # acked after the write, point included

        url = f"{server.url}/admin/cluster/nodes/gpu-01/charts/"
        status, html = await asyncio.to_thread(get, url, cookie)

    assert status == 200
    assert 'data-source="history"' in html
    assert 'id="chart-cpu" data-chart="cpu" data-points="1"' in html
    assert "42%" in html  # the legend's last value
