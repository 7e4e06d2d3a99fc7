"""A supervisor in a process of its own, so a test can kill -9 it: the agent's stand-in.

python -m tests.engines.supervisor_host STATE_DIR PORT_LO DESIRED_JSON
prints "READY <pid>" once the shard is ready, then waits to be killed.
"""

import asyncio
import sys
from pathlib import Path

from agentd import protocol
from agentd.supervisor import Supervisor


async def main(state_dir: str, port_lo: str, desired_json: str) -> None:
    desired = protocol.parse_control_message(desired_json)
    ready = asyncio.Event()

    async def on_event(msg):
        if msg.type == "shard_status" and msg.state == "ready":
            ready.set()

    sup = Supervisor(
        Path(state_dir),
        port_range=(int(port_lo), int(port_lo) + 19),
        binaries={"fake": sys.executable},
        on_event=on_event,
        host="127.0.0.1",
    )
    await sup.start()
    await sup.apply(desired)
    await ready.wait()
    pid = sup.process_groups()[desired.shards[0].shard_id]
    print(f"READY {pid}", flush=True)
    await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:4]))
