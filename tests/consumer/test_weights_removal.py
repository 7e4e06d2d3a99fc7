"""A clean-up proposal through the node's socket: sent while current, dropped when a
placement moved the node's desired set first, and the node's reply recorded."""

import asyncio
from datetime import timedelta

import pytest
from django.utils import timezone

from fleet.models import LocalWeights, Node, WeightsEvent
from fleet.services.desired import bump_desired
from fleet.services.weights_gc import cleanup
from tests.consumer.helpers import db, enrol, run_closing_connections
from tests.reconciler.test_reconcile_lock import held_elsewhere

pytestmark = pytest.mark.django_db(transaction=True)

W = "/var/lib/llmgw/weights"
WEIGHTS = [
    {"path": f"{W}/old.gguf", "size_bytes": 3000},
    {"path": f"{W}/older.gguf", "size_bytes": 4000},
]


def _age_weights():
    LocalWeights.objects.update(unused_since=timezone.now() - timedelta(days=2))


async def _next(agent, kind, timeout=5):
    while True:
        msg = await agent.recv(timeout=timeout)
        if msg["type"] == kind:
            return msg


async def test_the_proposal_reaches_the_node_and_its_reply_is_recorded():
    agent = await enrol("cpu-01", weights=WEIGHTS)
    try:
        await db(run_closing_connections)(_age_weights)
        report = await db(run_closing_connections)(cleanup.run_pass)
        assert len(report.proposals) == 2

        msg = await _next(agent, "remove_weights")

        assert sorted(msg["paths"]) == [f"{W}/old.gguf", f"{W}/older.gguf"]
        node = await db(Node.objects.get)(pk="cpu-01")
        assert msg["desired_version"] == node.desired_version
        await agent.send(
            {
                "type": "ack",
                "v": 1,
                "of": "remove_weights",
                "ok": False,
                "request_id": msg["request_id"],
                "removed": [f"{W}/old.gguf"],
                "kept": [{"path": f"{W}/older.gguf", "reason": "held open by engine 77"}],
            }
        )
        for _ in range(50):
            if not await db(LocalWeights.objects.filter(path=f"{W}/old.gguf").exists)():
                break
            await asyncio.sleep(0.1)
        events = await db(
            lambda: dict(
                WeightsEvent.objects.exclude(action="proposed").values_list("path", "reason")
            )
        )()
        assert events == {
            f"{W}/old.gguf": "removed by the node",
            f"{W}/older.gguf": "kept by the node: held open by engine 77",
        }
        node = await db(Node.objects.get)(pk="cpu-01")
        assert node.weights_reclaimed_bytes == 3000
    finally:
        await agent.close()


async def test_a_desired_set_moved_before_delivery_drops_the_proposal():
    agent = await enrol("cpu-01", weights=WEIGHTS)
    try:
        await db(run_closing_connections)(_age_weights)
        # A reconciler pass holds the lock: the socket's delivery waits for it.
        with held_elsewhere():
            report = await db(run_closing_connections)(cleanup.run_pass)
            assert len(report.proposals) == 2
            await asyncio.sleep(0.5)  # the doorbell has come and the socket is waiting
            # That pass places a shard on the node: its desired set moves on.
            await db(run_closing_connections)(bump_desired, ["cpu-01"])
        desired = await _next(agent, "desired")
        assert desired["version"] == 1

        # The socket sends no removal, and says why in the events.
        for _ in range(50):
            if await db(WeightsEvent.objects.filter(action="dropped").count)() == 2:
                break
            await asyncio.sleep(0.1)
        assert await agent.comm.receive_nothing(timeout=1)
        reasons = await db(
            lambda: list(WeightsEvent.objects.filter(action="dropped").values_list("reason"))
        )()
        assert len(reasons) == 2 and "from v0 to v1" in reasons[0][0]
        assert await db(LocalWeights.objects.filter(removal="").count)() == 2
    finally:
        await agent.close()
