"""Reliability rows 5 and 8: the control plane's own outages under a steady load.

Row 5: Daphne, the Celery worker and beat all go down for 20 s and come back.
The gateway runs inside Daphne, so requests sent while it is down fail to
connect; the test counts them rather than hiding them. Row 8: Redis (channel
layer and Celery broker) is stopped for 30 s while changes are made; each
change must converge afterwards, and none may be carried out twice.
"""

import time

import pytest

from fleet.models import Model, Node, Shard
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

CONTROL_PLANE_DOWN_S = 20
REDIS_DOWN_S = 30


def test_control_plane_restarted_under_load_every_agent_back_nothing_lost_or_restarted(
    stack, tiny_model, record
):
    # given: two agents, one replica on each (spread), clients calling steadily
    agents = [stack.add_agent("cpu-a"), stack.add_agent("cpu-b")]
    stack.wait(lambda: Node.objects.filter(connected=True).count() == 2, "both agents")
    model_id = apply_model(stack, tiny_model)
    stack.api("patch", f"models/{model_id}/", json={"placement_policy": "spread"})
    stack.api("patch", f"models/{model_id}/", json={"desired_replicas": 2})
    shards = wait_serving(stack, count=2)
    assert {s.node_id for s in shards} == {"cpu-a", "cpu-b"}
    engines = {a.node_id: engine_processes(a.state_dir) for a in agents}
    before = {n.pk: n.registered_at for n in Node.objects.all()}
    node_states = set()

    with Load(stack.url, stack.inference_key, clients=4) as load:
        load.wait_requests(40)
        # when: the whole control plane goes down, stays down a while, and comes back
        down_at = time.monotonic()
        stack.stop_control_plane()
        time.sleep(CONTROL_PLANE_DOWN_S)
        stack.start_control_plane()
        up_at = time.monotonic()

        # then: every agent registers again with the new Daphne
        back_s = {}

        def all_back():
            for n in Node.objects.all():
                node_states.add(n.state)
                if n.pk not in back_s and n.connected and n.registered_at > before[n.pk]:
                    back_s[n.pk] = time.monotonic() - up_at
            return len(back_s) == len(before)

        stack.wait(all_back, "every agent to register again", timeout=120)
        wait_passes(stack, 5)
        for _ in range(3):  # states seen across several more passes
            node_states.update(Node.objects.values_list("state", flat=True))
            wait_passes(stack, 1)
        load.wait_requests(40)
    figures = load.summary()
    during = {k: load.count(k, since=down_at, until=up_at) for k in ("ok", "failed", "broken")}
    first_ok_after = min(
        (o.ended - up_at for o in list(load.outcomes) if o.kind == "ok" and o.started >= up_at),
        default=None,
    )

    restarts = sum(s.replica.restarts for s in live_shards())
    record(
        "5",
        down_s=CONTROL_PLANE_DOWN_S,
        agents_back_max_s=round(max(back_s.values()), 1),
        node_states_seen=sorted(node_states),
        engines_same=all(engine_processes(a.state_dir) == engines[a.node_id] for a in agents),
        restarts=restarts,
        requests_sent_while_down=sum(during.values()),
        failed_while_down=during["failed"] + during["broken"],
        first_ok_after_up_s=round(first_ok_after, 1) if first_ok_after is not None else None,
        **figures,
    )
    assert max(back_s.values()) <= 60, back_s
    assert "lost" not in node_states
    for agent in agents:
        assert engine_processes(agent.state_dir) == engines[agent.node_id]
    assert restarts == 0
    assert sorted(s.pk for s in live_shards()) == sorted(s.pk for s in shards)
    # Only requests sent while Daphne was away, or cut when it went, may have failed.
    assert load.count("failed", since=up_at + 5) == 0
    assert load.count("broken", since=up_at + 5) == 0


def test_redis_stopped_for_30_s_changes_made_before_and_during_converge_once(
    stack, tiny_model, record
):
    # given: one agent serving model a (one replica), model b declared with none
    agent = stack.add_agent("cpu-a")
    a = apply_model(stack, tiny_model, name="tiny-a")
    b = apply_model(stack, tiny_model, name="tiny-b", replicas=0)
    (first,) = wait_serving(stack, "tiny-a")
    first_pid = agent.engines()[first.pk]
    api_s = []

    def change(model_id, replicas):
        started = time.monotonic()
        stack.api("patch", f"models/{model_id}/", json={"desired_replicas": replicas})
        api_s.append(time.monotonic() - started)

    with Load(stack.url, stack.inference_key, model="tiny-a", clients=4) as load:
        load.wait_requests(40)
        # when: a change is made, Redis stops at once (before it can have converged),
        # and another change is made while Redis is away
        change(a, 2)
        stack.redis.stop()
        down_at = time.monotonic()
        time.sleep(REDIS_DOWN_S / 2)
        change(b, 1)
        time.sleep(REDIS_DOWN_S / 2)
        stack.redis.start()
        up_at = time.monotonic()

        # then: both changes converge once Redis is back
        stack.wait(lambda: len(ready_shards("tiny-a")) == 2, "tiny-a at 2 replicas", 180)
        stack.wait(lambda: len(ready_shards("tiny-b")) == 1, "tiny-b at 1 replica", 180)
        converged_s = time.monotonic() - up_at
        wait_passes(stack, 5)
        load.wait_requests(40)
    figures = load.summary()
    during = {k: load.count(k, since=down_at, until=up_at) for k in ("ok", "failed", "broken")}

    # and nothing was carried out twice: one shard per replica, one engine per shard,
    # as many engines started as shards were ever placed
    shards = live_shards("tiny-a") + live_shards("tiny-b")
    placed = Shard.objects.filter(replica__model__name__in=["tiny-a", "tiny-b"]).count()
    starts = engine_starts(stack)
    found = engine_processes(agent.state_dir)
    restarts = sum(s.replica.restarts for s in shards)
    record(
        "8",
        down_s=REDIS_DOWN_S,
        converged_after_up_s=round(converged_s, 1),
        api_change_max_s=round(max(api_s), 1),
        duplicate_shards=duplicate_shards("tiny-a") + duplicate_shards("tiny-b"),
        shards_placed=placed,
        engine_starts=starts,
        engine_processes=len(found),
        restarts=restarts,
        requests_while_down=sum(during.values()),
        ok_while_down=during["ok"],
        **figures,
    )
    assert duplicate_shards("tiny-a") == duplicate_shards("tiny-b") == 0
    assert [r for r in Model.objects.values_list("desired_replicas", flat=True)] == [2, 1]
    assert placed == len(shards) == 3
    assert starts == 3, "each engine started once"
    assert found == sorted((s.pk, agent.engines()[s.pk]) for s in shards)
    assert agent.engines()[first.pk] == first_pid and restarts == 0
    assert figures["failed"] == 0 and figures["broken"] == 0, figures
