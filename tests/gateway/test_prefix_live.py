"""Prefix-aware routing on a real web process, over engines that say which replica answered."""

import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest

from fleet.gateway import prefix, table
from fleet.models import Model
from tests.factories import inference_key, ready_model
from tests.gateway.live import client, wait_until

pytestmark = [pytest.mark.live, pytest.mark.django_db(transaction=True)]


def system_prompt(n: int) -> str:
    # Longer than GATEWAY_PREFIX_CHARS (1024): the question after it does not count.
    return f"You are assistant number {n}. Answer briefly and kindly. " * 30


def ask(c, system: str, question: str, model: str = "tiny"):
    return c.chat.completions.with_raw_response.create(
        model=model,
        messages=[{"role": "system", "content": system}, {"role": "user", "content": question}],
    )


def owners(replicas, systems) -> dict[str, str]:
    """Which replica the gateway's ring gives each system prompt to."""
    ring = prefix.Ring(
        [table.Upstream(r.pk, "tiny", "http://127.0.0.1:1", "tiny") for r in replicas]
    )
    return {
        s: ring.owner(
            prefix.key_of(
                "chat/completions", {"messages": [{"role": "system", "content": s}]}, 1024
            )
        ).replica_id
        for s in systems
    }


def prefix_routes(server, result: str) -> float:
    text = urllib.request.urlopen(server.url + "/metrics").read().decode()
    line = f'llmgw_gateway_prefix_routes_total{{model="tiny",result="{result}"}} '
    found = [row for row in text.splitlines() if row.startswith(line)]
    return float(found[0].split()[-1]) if found else 0.0


def test_under_even_load_each_prefix_stays_on_its_replica(gateway_server, upstreams):
    # given: two replicas, the same engines serving a second model without prefix routing
    a, b = upstreams("a"), upstreams("b")
    model, replicas = ready_model("tiny", [a, b])
    Model.objects.filter(pk=model.pk).update(prefix_routing=True)
    ready_model("plain", [a, b], node_prefix="plain")
    _, secret = inference_key()
    c = client(gateway_server, secret)
    # three system prompts owned by each replica, so both have work
    owner = owners(replicas, [system_prompt(n) for n in range(40)])
    systems = [s for s in owner if owner[s] == replicas[0].pk][:3]
    systems += [s for s in owner if owner[s] == replicas[1].pk][:3]

    # when: each is asked five different questions, one request at a time, interleaved
    seen: dict[str, set] = {s: set() for s in systems}
    plain: dict[str, set] = {s: set() for s in systems}
    for q in range(5):
        for s in systems:
            seen[s].add(ask(c, s, f"question {q}").headers["x-llmgw-replica"])
            plain[s].add(ask(c, s, f"question {q}", model="plain").headers["x-llmgw-replica"])

    # then: every request with one system prompt went to that prompt's replica
    assert seen == {s: {owner[s]} for s in systems}
    assert prefix_routes(gateway_server, "affinity") == 30
    # while least-outstanding, with both replicas idle, scattered them
    assert any(len(where) == 2 for where in plain.values())


def test_a_busy_replica_yields_its_prefix_to_the_other_and_takes_it_back(gateway_server, upstreams):
    # given: the replica that owns a system prompt holds every request until released
    a, b = upstreams("a", mode="hang"), upstreams("b")
    model, (ra, rb) = ready_model("tiny", [a, b])
    Model.objects.filter(pk=model.pk).update(prefix_routing=True)
    _, secret = inference_key()
    c = client(gateway_server, secret, timeout=30)
    owner = owners([ra, rb], [system_prompt(n) for n in range(40)])
    system = next(s for s in owner if owner[s] == ra.pk)

    # when: six requests with that prompt arrive one after another, none of a's finishing
    pool = ThreadPoolExecutor(8)
    sent = []
    for i in range(6):
        sent.append(pool.submit(ask, c, system, f"question {i}"))
        # held by a, or answered (by b) all the way back to the client
        wait_until(
            lambda n=i + 1: a.in_flight + sum(f.done() for f in sent) == n,
            what=f"request {i + 1} to be held or answered",
        )

    # then: a takes what its bounded load allows (1.25 × the average: two of them),
    # and b, the next replica on the ring, takes the overflow rather than it queueing
    assert (a.in_flight, b.served) == (2, 4)
    assert [f.result(timeout=10).headers["x-llmgw-replica"] for f in sent[2:]] == [rb.pk] * 4
    assert prefix_routes(gateway_server, "affinity") == 2
    assert prefix_routes(gateway_server, "overflow") == 4

    # when: a frees up
    a.mode = "ok"
    a.release.set()
    wait_until(lambda: a.in_flight == 0, what="a to finish")
    assert all(f.result(timeout=10).status_code == 200 for f in sent)

    # then: the prompt goes back to a, where its cache is
    assert {ask(c, system, f"again {i}").headers["x-llmgw-replica"] for i in range(3)} == {ra.pk}
    assert b.served == 4
    pool.shutdown()
