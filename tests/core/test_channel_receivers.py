"""One process, many listeners on the channel layer: an agent socket's consumer, the gateway's
refresh listener, a page waiting for a node's logs. A message to any of them must reach it
while the others wait, which channels_redis does only for channels of one prefix: its
receive lock's holder waits on the Redis list its own channel's prefix names, and waits
there for up to ``brpop_timeout`` at a time.

Found by the console's browser tests: with the gateway listening on a ``gateway.`` channel
in the same Daphne, a node's logs request and its reply sat behind the gateway's wait
until the page's 10 s bound ran out.
"""

import asyncio

from channels.layers import get_channel_layer
from channels_redis.core import RedisChannelLayer
from django.conf import settings

from fleet.services import doorbells

# Long enough that a message held behind another listener's wait misses the deadline
# below by far; a deadline only bounds the wait, it does not judge a speed.
HELD_BACK_S = 60
DEADLINE_S = 20


def _layer() -> RedisChannelLayer:
    layer = RedisChannelLayer(**settings.CHANNEL_LAYERS["default"]["CONFIG"])
    layer.brpop_timeout = HELD_BACK_S
    return layer


async def _delivered_while_another_listens(layer, listener: str, target: str) -> bool:
    waiting = asyncio.ensure_future(layer.receive(listener))  # takes the receive lock
    await asyncio.sleep(0.5)
    try:
        await layer.send(target, {"type": "node.doorbell"})
        async with asyncio.timeout(DEADLINE_S):
            message = await layer.receive(target)
        return message == {"type": "node.doorbell"}
    except TimeoutError:
        return False
    finally:
        waiting.cancel()
        await asyncio.gather(waiting, return_exceptions=True)
        await layer.flush()


def test_a_consumer_hears_its_doorbell_while_the_gateway_listens():
    async def scenario():
        layer = _layer()
        gateway = await doorbells.process_channel(layer)
        consumer = await layer.new_channel()  # what Channels gives every consumer
        return await _delivered_while_another_listens(layer, gateway, consumer)

    assert asyncio.run(scenario()), "the doorbell waited behind the gateway's listener"


def test_a_logs_reply_reaches_the_page_while_agent_sockets_listen():
    async def scenario():
        layer = _layer()
        consumer = await layer.new_channel()
        reply = await doorbells.process_channel(layer)
        return await _delivered_while_another_listens(layer, consumer, reply)

    assert asyncio.run(scenario()), "the logs reply waited behind a consumer's listener"


def test_the_configured_layer_is_the_one_these_tests_hold_to_it():
    # The property above is channels_redis's; the project must be on that layer.
    assert isinstance(get_channel_layer(), RedisChannelLayer)
