"""Reliability row 7: PostgreSQL stopped for 60 s under load.

The control plane runs on a PostgreSQL of the test's own (``stack_on_postgres``),
which the test stops with a fast shutdown, keeps down 60 s and starts again.
The gateway answers from its in-memory routing table and its cached keys, so
requests go on meanwhile; nothing the fleet was told before the outage may be
lost: two changes made just before it converge afterwards, once each, and no
node is declared lost for a silence that was the database's.
"""

import time

import pytest
from django.db import connection

from fleet.models import Node, Shard
from tests.e2e.helpers import (
    apply_model,
    duplicate_shards,
    engine_processes,
    engine_starts,
    live_shards,
    ready_shards,
    wait_passes,
    wait_serving,
)
from tests.processes import Load

pytestmark = pytest.mark.django_db(transaction=True)

DATABASE_DOWN_S = 60


def test_postgres_stopped_for_60_s_the_gateway_serves_and_changes_made_before_converge(
    stack_on_postgres, postgres, tiny_model, record
):
    stack = stack_on_postgres
    # given: two nodes; model a serving one replica, model b declared with none
    agents = [stack.add_agent("cpu-a"), stack.add_agent("cpu-b")]
    stack.wait(lambda: Node.objects.filter(connected=True).count() == 2, "both agents")
    a = apply_model(stack, tiny_model, name="tiny-a")
    b = apply_model(stack, tiny_model, name="tiny-b", replicas=0)
    (first,) = wait_serving(stack, "tiny-a")
    first_node = first.node_id
    first_pid = next(x.engines()[first.pk] for x in agents if x.node_id == first_node)
    node_states = set()
    registered = dict(Node.objects.values_list("pk", "registered_at"))
    back_s = {}

    def observe():
        """Note each node's state, and when its agent registered again after the outage."""
        for n in Node.objects.all():
            node_states.add(n.state)
            if n.pk not in back_s and n.connected and n.registered_at > registered[n.pk]:
                back_s[n.pk] = time.monotonic() - up_at

    with Load(stack.url, stack.inference_key, model="tiny-a", clients=4) as load:
        load.wait_requests(40)
        # when: two changes are made, and the database stops before they can converge
        stack.api("patch", f"models/{a}/", json={"desired_replicas": 2})
        stack.api("patch", f"models/{b}/", json={"desired_replicas": 1})
        postgres.stop()
        down_at = time.monotonic()
        time.sleep(DATABASE_DOWN_S)
        postgres.start()
        up_at = time.monotonic()
        connection.close()  # this process's connection went with the server

        # then: both changes converge once it is back, and no node was lost
        def converged():
            observe()
            return len(ready_shards("tiny-a")) == 2 and len(ready_shards("tiny-b")) == 1

        stack.wait(converged, "tiny-a at 2 replicas and tiny-b at 1", timeout=240)
        converged_s = time.monotonic() - up_at
        stack.wait(
            lambda: observe() or Node.objects.filter(connected=True, state="ready").count() == 2,
            "both nodes connected and ready",
            timeout=120,
        )
        for _ in range(5):  # states seen across several more passes
            observe()
            wait_passes(stack, 1)
        load.wait_requests(40)
    figures = load.summary()
    during = {k: load.count(k, since=down_at, until=up_at) for k in ("ok", "failed", "broken")}
    success = figures["ok"] / figures["requests"]
    success_while_down = during["ok"] / max(1, sum(during.values()))

    shards = live_shards("tiny-a") + live_shards("tiny-b")
    placed = Shard.objects.filter(replica__model__name__in=["tiny-a", "tiny-b"]).count()
    starts = engine_starts(stack)
    restarts = sum(s.replica.restarts for s in shards)
    first_agent = next(x for x in agents if x.node_id == first_node)
    record(
        "7",
        down_s=DATABASE_DOWN_S,
        success_pct=round(100 * success, 2),
        ok=figures["ok"],
        requests=figures["requests"],
        ok_while_down=during["ok"],
        requests_while_down=sum(during.values()),
        success_while_down_pct=round(100 * success_while_down, 2),
        converged_after_up_s=round(converged_s, 1),
        agents_back_max_s=round(max(back_s.values()), 1) if back_s else None,
        agents_registered_again=len(back_s),
        node_states_seen=sorted(node_states),
        nodes_lost=Node.objects.filter(state="lost").count(),
        duplicate_shards=duplicate_shards("tiny-a") + duplicate_shards("tiny-b"),
        shards_placed=placed,
        engine_starts=starts,
        restarts=restarts,
        problems=figures["problems"],
        rate_per_s=figures["rate_per_s"],
    )
    assert success >= 0.999, figures
    assert success_while_down >= 0.999, during
    assert "lost" not in node_states
    assert duplicate_shards("tiny-a") == duplicate_shards("tiny-b") == 0
    assert placed == len(shards) == 3
    assert starts == 3, "each engine started once"
    assert sum(len(engine_processes(x.state_dir)) for x in agents) == 3
    assert first_agent.engines()[first.pk] == first_pid and restarts == 0
