"""More than one of every process (issue 15): two web processes and two Celery workers
on one database and one Redis, HAProxy in front with docs/scaling.md's configuration;
one agent behind the balancer, one naming both web processes.

- a change made through one web process reaches agents connected to the other (their
  doorbells cross processes through the channel layer);
- the web process holding both agents killed -9: both are back on the other within
  15 s, their nodes neither suspect nor lost, no engine restarted, and requests
  through the surviving web process go on.
Two workers never run a pass at once: reliability row 11 shows it under a kill -9 of
the lock holder (tests/e2e/test_faults_reconciler.py).
"""

import re
import signal
import time

import pytest
import yaml

from fleet.models import Node, Replica
from tests.e2e.helpers import apply_model, engine_processes, live_shards, wait_serving
from tests.factories import join_token
from tests.processes import Load, free_port
from tests.processes.servers import LiveServer, start_celery, start_web
from tests.processes.stack import CELERY_WORKER, Agent
from tests.processes.tls import (
    HAPROXY_MISSING,
    HAProxy,
    documented_config,
    haproxy_binary,
    run_haproxy,
    swap,
)

pytestmark = pytest.mark.django_db(transaction=True)

# The bound the issue sets for agents of a killed web process to be back elsewhere.
BACK_WITHIN_S = 15
# HAProxy's connections to the web processes leave from this address, so a web
# process's log tells the balanced agent's socket from the agent connecting directly.
PROXY_SOURCE = "127.0.0.3"


def _balancer(directory, webs: list[LiveServer]) -> HAProxy:
    """HAProxy with docs/scaling.md's configuration in front of ``webs``."""
    binary = haproxy_binary()
    assert binary, HAPROXY_MISSING
    port = free_port()
    config = documented_config("scaling.md")
    config = swap(config, "bind :8000", f"bind 127.0.0.1:{port}", "scaling.md")
    for i, web in enumerate(webs, 1):
        config = swap(
            config,
            f"server web{i} 10.0.0.1{i - 1}:8000",
            f"server web{i} 127.0.0.1:{web.port} source {PROXY_SOURCE}",
            "scaling.md",
        )
    return run_haproxy(binary, directory, config, port, name="haproxy-lb")


def _agent(stack, node_id: str, url: str, *more: str) -> Agent:
    """An agent of the stack connecting to ``url``, then to ``more`` in turn."""
    _, secret = join_token(name=f"e2e {node_id}", uses=1)
    agent = Agent(stack.tmp / node_id, node_id, url, secret)
    if more:
        config = yaml.safe_load(agent.config.read_text())
        config["control_plane_urls"] = list(more)
        agent.config.write_text(yaml.safe_dump(config))
    agent.start()
    stack.agents.append(agent)
    return agent


def _registrations(agent: Agent) -> list[str]:
    """The URL of each registration, in order, from the agent's log."""
    text = "".join(p.read_text(errors="replace") for p in agent.logs())
    return re.findall(r"registered node=\S+ .* via=(\S+)", text)


def _balanced_sockets(web: LiveServer) -> int:
    """Agent sockets the balancer opened to ``web`` and that are still open (the consumer's log)."""
    text = web.output()
    source = re.escape(PROXY_SOURCE)
    opened = len(re.findall(rf"agent socket open client={source}:\d+", text))
    closed = len(re.findall(rf"agent socket ended .* client={source}:\d+", text))
    return opened - closed


def _connected(stack, node_id: str) -> None:
    stack.wait(lambda: Node.objects.filter(pk=node_id, connected=True).exists(), node_id)


def test_two_web_processes_and_two_workers_serve_one_fleet(stack, tiny_model, record):
    # given: a second web process and a second worker beside the stack's own, and
    # HAProxy in front of both
    webs = [stack.web, start_web(stack.tmp, **stack.env)]
    stack.celery.append(start_celery(stack.tmp, "worker-b", CELERY_WORKER, **stack.env))
    proxy = _balancer(stack.tmp, webs)
    try:
        # an agent behind the balancer; the web process it landed on is the one to kill
        balanced = _agent(stack, "cpu-lb", f"ws://127.0.0.1:{proxy.port}/ws/agent/")
        _connected(stack, "cpu-lb")
        doomed = next(w for w in webs if _balanced_sockets(w) == 1)
        other = next(w for w in webs if w is not doomed)
        # and an agent naming both web processes, the doomed one first
        direct = _agent(stack, "cpu-direct", doomed.ws_url, other.ws_url)
        _connected(stack, "cpu-direct")
        # (the agent logs its registration once it has the ack, a moment after the
        # control plane wrote the node connected)
        stack.wait(lambda: _registrations(direct), "cpu-direct to log its registration")
        assert _registrations(direct) == [doomed.ws_url]

        # when: the model is declared through the other web process (two replicas)
        stack.web = other
        model_id = apply_model(stack, tiny_model, replicas=0)
        stack.api("patch", f"models/{model_id}/", json={"placement_policy": "spread"})
        stack.api("patch", f"models/{model_id}/", json={"desired_replicas": 2})
        # then: the doorbells cross processes: both agents start their replica
        shards = wait_serving(stack, count=2)
        assert {s.node_id for s in shards} == {"cpu-lb", "cpu-direct"}
        engines = {a.node_id: dict(engine_processes(a.state_dir)) for a in (balanced, direct)}

        with Load(stack.url, stack.inference_key, clients=2) as load:
            load.wait_requests(20)
            # when: the web process holding both agents is killed -9
            killed_at = time.monotonic()
            doomed.proc.send_signal(signal.SIGKILL)
            doomed.proc.wait()
            # then: both register again through the other, and neither node is ever
            # suspect or lost
            states = set()

            def both_back():
                states.update(Node.objects.values_list("state", flat=True))
                return (
                    _registrations(direct)[-1:] == [other.ws_url]
                    and len(_registrations(balanced)) == 2
                    and _balanced_sockets(other) == 1
                )

            stack.wait(both_back, "both agents to register through the other web process", 60)
            back_s = time.monotonic() - killed_at
            _connected(stack, "cpu-lb")
            _connected(stack, "cpu-direct")
            load.wait_requests(20)
        figures = load.summary()
    finally:
        proxy.stop()
        for web in webs:
            web.stop()

    after = live_shards()
    replicas = Replica.objects.filter(pk__in=[s.replica_id for s in after])
    same = {a.node_id: dict(engine_processes(a.state_dir)) for a in (balanced, direct)} == engines
    record(
        "13",
        back_on_other_web_s=round(back_s, 1),
        node_states_seen=sorted(states),
        engines_same=same,
        restarts=sum(r.restarts for r in replicas),
        **figures,
    )
    assert back_s <= BACK_WITHIN_S, f"back on the other web process after {back_s:.1f} s"
    assert states == {"ready"}, states
    assert sorted(s.pk for s in after) == sorted(s.pk for s in shards) and same
    assert sum(r.restarts for r in replicas) == 0
    # Requests go through the web process that stayed: none fails.
    assert figures["failed"] == 0 and figures["broken"] == 0, figures
