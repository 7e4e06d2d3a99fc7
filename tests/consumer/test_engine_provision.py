"""Wanted engines and a node's vLLM build reach the connected node at once (docs/engines.md).

An operator changes a node's build in the admin (form and bulk action), with
``manage.py engine_build`` or through the API, or changes the wanted engines:
the node's socket sends a new provision message as soon as the change commits.
"""

import time

import pytest
from django.core.management import call_command
from django.test import Client
from django.urls import reverse

from fleet.models import Node, WantedEngine
from fleet.services import catalog
from tests.admin.helpers import form_data
from tests.consumer.helpers import db, enrol, run_closing_connections
from tests.factories import bearer, manage_key, operator

pytestmark = pytest.mark.django_db(transaction=True)

# "At once": the bound for an operator's change to reach a connected node.
AT_ONCE_S = 1.0


async def next_provision(agent, what: str, started: float) -> tuple[dict, float]:
    """The provision message the change caused, and how long since the operator acted
    (printed)."""
    while True:
        msg = await agent.recv(timeout=AT_ONCE_S)
        if msg["type"] == "provision":
            took = time.monotonic() - started
            print(f"\n{what}: provision reached the node in {took * 1000:.0f} ms")
            return msg, took


def wants(msg) -> list[tuple[str, str, str]]:
    return [(e["engine"], e["version"], e["variant"]) for e in msg["engines"]]


def prepared(how: str):
    """The operator's act, ready to run: keys and logins are made before the clock starts."""
    if how == "command":
        return lambda: call_command("engine_build", "gpu-07", "cu129")
    client = Client()
    if how == "api":
        _, secret = manage_key()
        # a running server has the API loaded: its first-request imports are not the change's
        assert client.get("/api/v1/nodes/gpu-07/", **bearer(secret)).status_code == 200
        return lambda: (
            client.post(
                "/api/v1/nodes/gpu-07/vllm-build/",
                {"vllm_build": "cu129"},
                content_type="application/json",
                **bearer(secret),
            ).status_code
        )
    client.force_login(operator("admin-ops"))
    if how == "admin form":
        # The node's change page as the operator's browser would send it back: every
        # field it shows (the inlines' management forms too), the build changed.
        url = reverse("admin:fleet_node_change", args=["gpu-07"])
        data = form_data(client.get(url).content.decode())
        assert data["vllm_build"] == "auto"
        data["vllm_build"] = "cu129"
        return lambda: client.post(url, data).status_code
    return lambda: (
        client.post(
            reverse("admin:fleet_node_changelist"),
            {"action": "vllm_build_cu129", "_selected_action": ["gpu-07"]},
        ).status_code
    )


@pytest.mark.parametrize("how", ["command", "api", "admin action", "admin form"])
async def test_an_operators_build_change_reaches_the_connected_node_within_a_second(how):
    await db(WantedEngine.objects.create)(engine="vllm", version="0.11.2")
    agent = await enrol("gpu-07")
    try:
        # registered: the node was told the wanted engines with its build (auto)
        assert (await db(Node.objects.get)(pk="gpu-07")).vllm_build == "auto"

        act = await db(run_closing_connections)(prepared, how)
        started = time.monotonic()
        status = await db(run_closing_connections)(act)
        assert status == {"command": None, "api": 200}.get(how, 302)
        msg, took = await next_provision(agent, how, started)
        assert wants(msg) == [("vllm", "0.11.2", "cu129")]
        assert took <= AT_ONCE_S
        assert (await db(Node.objects.get)(pk="gpu-07")).vllm_build == "cu129"
    finally:
        await agent.close()


async def test_a_changed_engine_version_reaches_every_connected_node():
    await db(WantedEngine.objects.create)(engine="llamacpp", version="0.3.35")
    a, b = await enrol("cpu-01"), await enrol("cpu-02")
    try:
        started = time.monotonic()
        # apply -f, as an operator would: the row's save tells every connected node
        await db(run_closing_connections)(catalog.apply, "engines:\n  llamacpp: 0.3.36\n")
        for agent in (a, b):
            msg, took = await next_provision(agent, agent.node_id, started)
            assert wants(msg) == [("llamacpp", "0.3.36", "")]
            assert took <= AT_ONCE_S
    finally:
        await a.close()
        await b.close()


async def test_a_node_is_told_the_wanted_engines_at_registration_even_when_there_are_none():
    from tests.consumer.helpers import communicator, recv, register_msg, send
    from tests.factories import join_token

    # No engine is wanted (the last one was removed while this node was away).
    _, secret = await db(join_token)()
    comm = communicator(secret)
    assert (await comm.connect())[0]
    try:
        await send(comm, register_msg("cpu-09"))
        msgs = [await recv(comm) for _ in range(3)]
        # An empty provision, before the desired set: the agent drops installs it restored.
        assert [m["type"] for m in msgs] == ["ack", "provision", "desired"]
        assert msgs[1]["engines"] == []
    finally:
        await comm.disconnect()
