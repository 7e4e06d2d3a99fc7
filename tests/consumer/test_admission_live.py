"""A web process past its admission limit, through a real server and a real WebSocket
client: the agent is told at once when to come back, in a way agentd retries."""

import json

import pytest
from websockets.exceptions import InvalidStatus

from agentd.client import Backoff, retry_after_s
from tests.consumer.test_live_agent_socket import connect, enrol, recv
from tests.factories import register_msg
from tests.processes import start_web

pytestmark = [pytest.mark.live, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def one_at_a_time(transactional_db, tmp_path):
    """A web process that takes one agent at a time between the knock and the register's ack."""
    server = start_web(tmp_path, LLMGW_AGENT_HANDSHAKES_MAX="1")
    yield server
    server.stop()


async def test_an_agent_past_the_limit_is_told_when_to_come_back(one_at_a_time):
    server = one_at_a_time
    first = await enrol(server, "gpu-01")
    second = await enrol(server, "gpu-02")

    async with connect(server, first) as knocking:  # taken, not registered yet
        # uvicorn answers the handshake itself: 503, and when, in Retry-After
        with pytest.raises(InvalidStatus) as info:
            async with connect(server, second):
                pass
        response = info.value.response
        assert response.status_code == 503
        assert 1 <= int(response.headers["Retry-After"]) <= 30
        assert response.body.startswith(b"too many agents registering at once; retry after")
        # what agentd does with it: waits what it was told, not its backoff
        asked = retry_after_s(info.value)
        assert asked == int(response.headers["Retry-After"])
        assert asked <= Backoff().wait_after(info.value) < asked + 1

        await knocking.send(register_msg_json("gpu-01"))
        assert (await recv(knocking, "ack"))["of"] == "register"

        # the first is through: the next is taken
        async with connect(server, second) as ws:
            await ws.send(register_msg_json("gpu-02"))
            assert (await recv(ws, "ack"))["of"] == "register"


def register_msg_json(node_id: str) -> str:
    return json.dumps(register_msg(node_id))
