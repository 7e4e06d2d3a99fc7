"""Agent sockets joining and leaving their nodes' groups in batches (fleet.sockets.groups),
on the test run's real Redis: what a ring reaches afterwards is what a node would notice."""

import asyncio

import pytest
from channels_redis.core import RedisChannelLayer
from django.conf import settings
from redis.exceptions import ConnectionError as RedisConnectionError

from fleet.services import doorbells
from fleet.sockets import groups

SOCKETS = 2000


def _layer(**config) -> RedisChannelLayer:
    return RedisChannelLayer(**{**settings.CHANNEL_LAYERS["default"]["CONFIG"], **config})


async def _heard(layer, channel: str) -> dict | None:
    try:
        async with asyncio.timeout(0.5):
            return await layer.receive(channel)
    except TimeoutError:
        return None


def test_thousands_join_and_leave_at_once_and_rings_follow():
    async def scenario():
        layer = _layer()
        channels = [await layer.new_channel() for _ in range(SOCKETS)]
        nodes = [f"gpu-{i:04d}" for i in range(SOCKETS)]
        try:
            # A whole web process's sockets at once: all in, then all out but the first.
            await asyncio.gather(
                *(
                    groups.join(layer, doorbells.node_group(n), c)
                    for n, c in zip(nodes, channels, strict=True)
                )
            )
            await layer.group_send(doorbells.node_group(nodes[-1]), {"type": "node.doorbell"})
            joined = await _heard(layer, channels[-1])
            await asyncio.gather(
                *(
                    groups.leave(layer, doorbells.node_group(n), c)
                    for n, c in zip(nodes[1:], channels[1:], strict=True)
                )
            )
            await layer.group_send(doorbells.node_group(nodes[-1]), {"type": "node.doorbell"})
            await layer.group_send(doorbells.node_group(nodes[0]), {"type": "node.doorbell"})
            after_leaving = await _heard(layer, channels[-1])
            stayed = await _heard(layer, channels[0])
            conn = layer.connection(0)
            members = sum(
                [await conn.zcard(groups.group_key(layer, doorbells.node_group(n))) for n in nodes]
            )
            return joined, after_leaving, stayed, members
        finally:
            await layer.flush()

    joined, after_leaving, stayed, members = asyncio.run(scenario())
    assert joined == {"type": "node.doorbell"}
    assert after_leaving is None, "a socket that left its node's group still hears its rings"
    assert stayed == {"type": "node.doorbell"}, "the socket that stayed lost its group"
    assert members == 1


def test_a_join_and_leave_in_one_batch_keep_their_order():
    async def scenario():
        layer = _layer()
        channel = await layer.new_channel()
        group = doorbells.node_group("gpu-order")
        try:
            # Both asked before either is written: one batch, join first.
            await asyncio.gather(
                groups.join(layer, group, channel), groups.leave(layer, group, channel)
            )
            left = await layer.connection(0).zcard(groups.group_key(layer, group))
            await asyncio.gather(
                groups.leave(layer, group, channel), groups.join(layer, group, channel)
            )
            rejoined = await layer.connection(0).zcard(groups.group_key(layer, group))
            return left, rejoined
        finally:
            await layer.flush()

    assert asyncio.run(scenario()) == (0, 1)


def test_redis_away_fails_every_socket_of_the_batch():
    async def scenario():
        # A port nothing listens on: every join of the batch hears why.
        layer = _layer(hosts=[{"address": "redis://127.0.0.1:9", "socket_connect_timeout": 2}])
        return await asyncio.gather(
            *(groups.join(layer, doorbells.node_group(f"n{i}"), f"c.{i}") for i in range(50)),
            return_exceptions=True,
        )

    outcomes = asyncio.run(scenario())
    assert len(outcomes) == 50
    assert all(isinstance(o, RedisConnectionError) for o in outcomes), outcomes[:3]


def test_a_redis_host_away_fails_only_the_sockets_whose_groups_it_holds():
    async def scenario():
        good = settings.CHANNEL_LAYERS["default"]["CONFIG"]["hosts"][0]
        away = {"address": "redis://127.0.0.1:9", "socket_connect_timeout": 2}
        layer = _layer(hosts=[good, away])
        groups_on = {0: [], 1: []}
        i = 0
        while min(len(g) for g in groups_on.values()) < 5:
            group = doorbells.node_group(f"gpu-{i:03d}")
            groups_on[layer.consistent_hash(group)].append(group)
            i += 1
        channel = await layer.new_channel()
        try:
            outcomes = await asyncio.gather(
                *(groups.join(layer, g, channel) for g in groups_on[0] + groups_on[1]),
                return_exceptions=True,
            )
            members = [
                await layer.connection(0).zcard(groups.group_key(layer, g)) for g in groups_on[0]
            ]
            return outcomes, len(groups_on[0]), members
        finally:
            await layer.connection(0).delete(*(groups.group_key(layer, g) for g in groups_on[0]))

    outcomes, on_good, members = asyncio.run(scenario())
    assert outcomes[:on_good] == [None] * on_good
    assert members == [1] * on_good
    assert all(isinstance(o, RedisConnectionError) for o in outcomes[on_good:])


def test_other_layers_get_the_plain_calls():
    from channels.layers import InMemoryChannelLayer

    async def scenario():
        layer = InMemoryChannelLayer()
        await groups.join(layer, "node.a", "c.1")
        await layer.group_send("node.a", {"type": "node.doorbell"})
        heard = await layer.receive("c.1")
        await groups.leave(layer, "node.a", "c.1")
        return heard, layer.groups.get("node.a")

    heard, members = asyncio.run(scenario())
    assert heard == {"type": "node.doorbell"}
    assert not members


@pytest.mark.parametrize("op", ["join", "leave"])
def test_a_bad_name_fails_alone_and_says_which(op):
    async def scenario():
        layer = _layer()
        channel = await layer.new_channel()
        try:
            bad, good = await asyncio.gather(
                getattr(groups, op)(layer, "no spaces allowed", channel),
                groups.join(layer, "node.fine", channel),
                return_exceptions=True,
            )
            return bad, good, await layer.connection(0).zcard(groups.group_key(layer, "node.fine"))
        finally:
            await layer.flush()

    bad, good, members = asyncio.run(scenario())
    assert isinstance(bad, TypeError) and str(bad).startswith("Group name must be")
    assert good is None and members == 1
