"""A model over two nodes, on real processes: llama.cpp's RPC across two agents.

Each agent is a node of its own (its node id and state dir, loopback addresses)
and installs llama.cpp itself, as the control plane asks: llama-cpp-python and
llama.cpp's llama-server and ggml-rpc-server built with RPC (agentd.llamatools),
verified before they count. The follower (rank 1) runs ggml-rpc-server on
loopback behind a relay that lets only the leader's address through
(agentd/rpcrelay.py); the leader (rank 0) runs llama-server with ``--rpc`` once
the follower listens. A peer from another address (127.0.0.2) is refused.
Then each fault the issue names, each timed: the follower's rpc-server killed,
the follower's node silent past the grace, a node of the group drained. After
each, the shards are checked: one whole group runs, never half of one.
"""

import os
import socket
import time

import pytest

from fleet.models import EngineInstall, Model, Node, Replica
from tests.e2e.helpers import answers, engine_processes, live_shards
from tests.e2e.test_engine_install import pinned_llama_cpp_python
from tests.processes import Load

pytestmark = pytest.mark.django_db(transaction=True)

NAME = "tiny-llama"
# The first install on a machine compiles the two tools (minutes on 2 cores);
# later ones copy them from the build cache.
INSTALL_S = 1200


def _installed(node_ids, version) -> bool:
    rows = EngineInstall.objects.filter(node_id__in=node_ids, engine="llamacpp", state="installed")
    return rows.count() == len(node_ids) and all(
        Node.objects.get(pk=n).engine_versions.get("llamacpp") == version for n in node_ids
    )


def _add_nodes(stack, version, *node_ids):
    agents = [stack.add_agent(n, engines={}) for n in node_ids]
    stack.wait(
        lambda: Node.objects.filter(pk__in=node_ids, connected=True).count() == len(node_ids),
        f"{', '.join(node_ids)} to register",
    )
    stack.wait(lambda: _installed(node_ids, version), "llama.cpp installed", INSTALL_S)
    return agents


def _whole_group(nodes: int = 2):
    """The model's one replica, ready, as one group: a shard per rank on distinct nodes;
    else None."""
    shards = live_shards(NAME)
    replicas = {s.replica_id for s in shards}
    if len(replicas) != 1 or len(shards) != nodes:
        return None
    replica = Replica.objects.get(pk=replicas.pop())
    if replica.state != "ready" or any(s.state != "ready" for s in shards):
        return None
    if sorted(s.rank for s in shards) != list(range(nodes)):
        return None
    if len({s.node_id for s in shards}) != nodes:
        return None
    return sorted(shards, key=lambda s: s.rank)


def _running(agents) -> dict[str, tuple[str, int]]:
    """shard id -> (node id, pid) of every engine any of the agents started."""
    return {sid: (a.node_id, pid) for a in agents for sid, pid in engine_processes(a.state_dir)}


def _cmdline(pid: int) -> list[str]:
    with open(f"/proc/{pid}/cmdline", "rb") as fh:
        return [p.decode() for p in fh.read().split(b"\0") if p]


def _rpc_server(relay_pid: int):
    """The follower's ggml-rpc-server: the child of the relay the agent started."""
    import psutil

    (child,) = psutil.Process(relay_pid).children()
    return child


def _recv_or_reset(sock: socket.socket) -> bytes:
    try:
        return sock.recv(16)
    except ConnectionResetError:
        return b""


def _serving(stack, what, timeout=180, new_since=(), off=None):
    """The whole group once it serves: made of none of ``new_since``'s shards and on
    no shard of node ``off``, when given."""
    old = {s.pk for s in new_since}

    def whole():
        group = _whole_group()
        if not group or old & {s.pk for s in group}:
            return None
        return None if off in {s.node_id for s in group} else group

    group = stack.wait(whole, what, timeout)
    stack.wait(lambda: answers(stack, NAME), f"the gateway to answer ({what})")
    return group


def test_a_two_node_llamacpp_replica_serves_restarts_moves_and_drains_as_one_group(
    stack, tiny_model, record
):
    # given: the fleet wants llama.cpp, and two nodes that install it themselves
    version = pinned_llama_cpp_python()
    stack.api("post", "engines/", json={"engine": "llamacpp", "version": version})
    agents = {a.node_id: a for a in _add_nodes(stack, version, "rpc-a", "rpc-b")}

    # when: a model with nodes: 2 is applied through the API
    started = time.monotonic()
    model = stack.api("post", "models/", json={"name": NAME, "desired_replicas": 1})
    profile = stack.api(
        "post",
        "engine-profiles/",
        json={"model": model["id"], "name": "rpc", "engine": "llamacpp", "nodes": 2,
              "model_path": str(tiny_model)},
    )  # fmt: skip
    stack.api("patch", f"models/{model['id']}/", json={"active_profile": profile["id"]})
    leader, follower = _serving(stack, "the two-node group to serve")
    ready_s = time.monotonic() - started

    # then: rank 0 serves through llama-server with --rpc naming rank 1's address, where
    # a relay lets the leader's address through to an rpc-server listening on loopback
    running = _running(agents.values())
    assert set(running) == {leader.pk, follower.pk}
    lead_argv = _cmdline(running[leader.pk][1])
    relay_argv = _cmdline(running[follower.pk][1])
    assert os.path.basename(lead_argv[0]) == "llama-server", lead_argv
    assert lead_argv[lead_argv.index("--rpc") + 1] == f"127.0.0.1:{follower.port}"
    assert os.path.basename(relay_argv[1]) == "rpcrelay.py", relay_argv
    assert relay_argv[relay_argv.index("--port") + 1] == str(follower.port)
    assert relay_argv[relay_argv.index("--allow") + 1] == "127.0.0.1"  # the leader's address
    rpc_server = _rpc_server(running[follower.pk][1])
    assert os.path.basename(rpc_server.exe()) == "ggml-rpc-server"
    (listening,) = [c.laddr for c in rpc_server.net_connections() if c.status == "LISTEN"]
    assert listening.ip == "127.0.0.1" and listening.port != follower.port
    assert answers(stack, NAME) in ("stop", "length")

    # when: a peer from another address reaches the follower's port
    log = agents[follower.node_id].state_dir / "shards" / f"{follower.pk}.log"
    with socket.create_connection(("127.0.0.1", follower.port), 10, ("127.0.0.2", 0)) as peer:
        peer.sendall(b"\x00" * 64)
        # then: it is closed without an answer, logged, and the group serves on
        assert _recv_or_reset(peer) == b""
    stack.wait(lambda: "refused a connection from 127.0.0.2" in log.read_text(), "the refusal")
    assert answers(stack, NAME) in ("stop", "length")

    # when: the follower's rpc-server is killed
    killed = time.monotonic()
    rpc_server.kill()

    # then: the replica restarts as a group (both shards new) and serves again;
    # the old leader is stopped, not left half a group
    leader2, follower2 = _serving(stack, "the group to restart", new_since=(leader, follower))
    restart_s = time.monotonic() - killed
    stack.wait(lambda: set(_running(agents.values())) == {leader2.pk, follower2.pk},
               "only the new group's engines to run")  # fmt: skip

    # when: the follower's node goes silent past the model's grace, a third node beside
    (third,) = _add_nodes(stack, version, "rpc-c")
    agents["rpc-c"] = third
    Model.objects.filter(name=NAME).update(replace_after_s=10)
    silent_node = follower2.node_id
    silent = time.monotonic()
    agents[silent_node].kill_9()

    # then: the group is replaced on the nodes that answer, the survivor's old rank stopped
    leader3, follower3 = _serving(stack, "the group replaced off the silent node", 240,
                                  off=silent_node)  # fmt: skip
    replaced_s = time.monotonic() - silent
    others = [a for n, a in agents.items() if n != silent_node]
    stack.wait(lambda: set(_running(others)) == {leader3.pk, follower3.pk},
               "only the new group's engines to run on the answering nodes")  # fmt: skip

    # when: the silent node is back, and then a node of the group is drained under load
    agents[silent_node].start()
    stack.wait(lambda: Node.objects.get(pk=silent_node).state == "ready", "the node to be back")
    stack.wait(lambda: set(_running(agents.values())) == {leader3.pk, follower3.pk},
               "the returning node's duplicate to stop")  # fmt: skip
    drained_node = follower3.node_id
    with Load(stack.url, stack.inference_key, clients=2, stream_every=1) as load:
        load.wait_requests(10)
        drained = time.monotonic()
        stack.api("post", f"nodes/{drained_node}/drain/")
        leader4, follower4 = _serving(stack, "the group to move off the drained node", 240,
                                      off=drained_node)  # fmt: skip
        stack.wait(
            lambda: (n := Node.objects.get(pk=drained_node)).cordoned and not n.draining,
            f"{drained_node} to be drained",
            240,
        )
        drain_s = time.monotonic() - drained
        load.wait_requests(10)
    figures = load.summary()
    stack.wait(lambda: set(_running(agents.values())) == {leader4.pk, follower4.pk},
               "only the moved group's engines to run")  # fmt: skip
    assert figures["failed"] == 0 and figures["broken"] == 0, figures

    record(
        "14",
        apply_to_ready_s=round(ready_s, 1),
        rpc_server_killed_to_serving_s=round(restart_s, 1),
        follower_node_silent_to_serving_s=round(replaced_s, 1),
        drain_s=round(drain_s, 1),
        requests_during_drain=figures["requests"],
    )
