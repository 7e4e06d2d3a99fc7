"""Batched heartbeat writes: what a batch leaves in the inventory, on every write path.

On PostgreSQL the facts every heartbeat carries are written by one statement
(fleet/services/heartbeat/pg.py); elsewhere by the portable ORM code. Each test
runs on every path the database offers, so the two cannot drift apart.
"""

import logging
import threading
import time
from datetime import timedelta

import pytest
from django.utils import timezone

from agentd import protocol
from fleet.models import GPU, Node, NodeCredential, NodeLoad, NodeState, ShardLoad, Storage
from fleet.services import inventory
from fleet.services.heartbeat import apply as heartbeat_apply
from tests.consumer.conftest import ON_POSTGRES
from tests.factories import H100_GPUS, heartbeat_msg, make_shard, register_msg

pytestmark = pytest.mark.django_db


LOAD = {
    "cpu_percent": 41.5,
    "cpu_count": 224,
    "load1": 93.0,
    "load5": 90.5,
    "load15": 88.25,
    "memory_used_bytes": 600 * 2**30,
    "memory_available_bytes": 1400 * 2**30,
}


def node_with_credential(node_id: str) -> int:
    inventory.register_node(protocol.parse_agent_message(register_msg(node_id)))
    cred, _ = NodeCredential.issue(node=Node.objects.get(pk=node_id))
    return cred.pk


def hb(**fields) -> protocol.Heartbeat:
    return protocol.parse_agent_message(heartbeat_msg(**fields))


def storage_of(node_id):
    return sorted(
        Storage.objects.filter(node_id=node_id).values_list("path", "free_bytes", "shared")
    )


def shard_loads_of(node_id):
    return sorted(ShardLoad.objects.filter(node_id=node_id).values_list("shard_id", "cpu_cores"))


def test_a_batch_of_many_nodes_writes_each_nodes_facts(write_path):
    creds = {n: node_with_credential(n) for n in ("gpu-01", "gpu-02", "gpu-03")}
    make_shard("gpu-01", shard_id="s1")
    old = timezone.now() - timedelta(minutes=1)
    Node.objects.update(last_seen=old, connected=False)
    arrived = timezone.now() - timedelta(milliseconds=30)

    results = heartbeat_apply.apply_heartbeats(
        [
            (
                "gpu-01",
                creds["gpu-01"],
                hb(
                    storage=[{"path": "/var/lib/llmgw", "free_bytes": 5, "total_bytes": 9}],
                    load={**LOAD, "shards": [{"shard_id": "s1", "cpu_cores": 2.5, "rss_bytes": 7}]},
                ),
                arrived,
            ),
            # No storage and no load: no news, what was there stays.
            ("gpu-02", creds["gpu-02"], hb(), arrived),
            (
                "gpu-03",
                creds["gpu-03"],
                hb(
                    storage=[
                        {"path": "/models", "free_bytes": 8, "total_bytes": 10, "shared": True},
                        {"path": "/var/lib/llmgw", "free_bytes": 1, "total_bytes": 9},
                    ],
                    load=LOAD,
                ),
                arrived,
            ),
        ]
    )

    assert not any(r.revoked for r in results.values())
    for node in Node.objects.all():
        assert node.connected and node.last_seen > old and node.state == NodeState.READY
    assert storage_of("gpu-01") == [("/var/lib/llmgw", 5, False)]
    assert storage_of("gpu-02") == [("/var/lib/llmgw", 10**12, False)]  # from its register
    assert storage_of("gpu-03") == [("/models", 8, True), ("/var/lib/llmgw", 1, False)]
    load = NodeLoad.objects.get(node_id="gpu-01")
    assert load.sampled_at == arrived and load.load15 == 88.25
    assert load.memory_available_bytes == 1400 * 2**30
    assert shard_loads_of("gpu-01") == [("s1", 2.5)]
    assert not NodeLoad.objects.filter(node_id="gpu-02").exists()
    assert NodeLoad.objects.get(node_id="gpu-03").cpu_count == 224


def test_the_next_load_replaces_the_last_and_drops_stopped_shards(write_path):
    cred = node_with_credential("gpu-01")
    for shard_id in ("s1", "s2", "s3"):
        make_shard("gpu-01", shard_id=shard_id)
    shards = [
        {"shard_id": "s1", "cpu_cores": 1.0, "rss_bytes": 1},
        {"shard_id": "s2", "cpu_cores": 2.0, "rss_bytes": 2},
    ]
    first = timezone.now() - timedelta(seconds=10)
    heartbeat_apply.apply_heartbeats([("gpu-01", cred, hb(load={**LOAD, "shards": shards}), first)])

    # s1 stopped, s2 goes on, s3 started.
    now_shards = [
        {"shard_id": "s2", "cpu_cores": 2.75, "rss_bytes": 2},
        {"shard_id": "s3", "cpu_cores": 0.5, "rss_bytes": 3},
    ]
    second = timezone.now()
    heartbeat_apply.apply_heartbeats(
        [("gpu-01", cred, hb(load={**LOAD, "cpu_percent": 3.0, "shards": now_shards}), second)]
    )

    load = NodeLoad.objects.get(node_id="gpu-01")
    assert load.cpu_percent == 3.0 and load.sampled_at == second
    assert shard_loads_of("gpu-01") == [("s2", 2.75), ("s3", 0.5)]
    assert set(ShardLoad.objects.values_list("sampled_at", flat=True)) == {second}


def test_a_node_twice_in_one_batch_ends_as_its_later_heartbeat_says(write_path):
    cred = node_with_credential("gpu-01")
    Node.objects.filter(pk="gpu-01").update(desired_version=7)
    early, late = timezone.now() - timedelta(milliseconds=40), timezone.now()
    disk = {"path": "/var/lib/llmgw", "total_bytes": 9}

    heartbeat_apply.apply_heartbeats(
        [
            ("gpu-01", cred, hb(seq=1, storage=[{**disk, "free_bytes": 3}], load=LOAD,
                               desired_version=5), early),
            # No desired version: silence, the 5 above stands.
            ("gpu-01", cred, hb(seq=2, storage=[{**disk, "free_bytes": 2}],
                               load={**LOAD, "cpu_percent": 9.0}), late),
        ]
    )  # fmt: skip

    assert storage_of("gpu-01") == [("/var/lib/llmgw", 2, False)]
    load = NodeLoad.objects.get(node_id="gpu-01")
    assert load.cpu_percent == 9.0 and load.sampled_at == late
    assert Node.objects.get(pk="gpu-01").acked_version == 5


@pytest.mark.parametrize(
    ("reported", "desired", "acked"),
    [
        (3, 7, 3),  # behind: the agent has applied 3
        (7, 7, 7),  # caught up
        (9, 7, 7),  # ahead of what exists (a stale control plane): never past desired
        (0, 7, 4),  # an agent that says nothing changes nothing
    ],
)
def test_the_acknowledged_desired_version(write_path, reported, desired, acked):
    cred = node_with_credential("gpu-01")
    Node.objects.filter(pk="gpu-01").update(desired_version=desired, acked_version=4)

    result = heartbeat_apply.apply_heartbeats(
        [("gpu-01", cred, hb(desired_version=reported), timezone.now())]
    )

    assert Node.objects.get(pk="gpu-01").acked_version == acked
    assert result["gpu-01", cred].desired_version == desired


LATER = timezone.now() - timedelta(minutes=5)


@pytest.mark.parametrize(
    ("reported", "acked", "since", "expect"),
    [
        (0, 4, LATER, "kept"),  # says nothing: changes nothing
        (4, 4, LATER, "kept"),  # the same version again: no progress, the clock runs on
        (5, 4, LATER, "now"),  # forward but still behind 7: converging, timed from now
        (5, 4, None, "now"),
        (7, 4, LATER, None),  # caught up
        (9, 4, LATER, None),  # ahead of what exists: caught up at 7
        (3, 4, LATER, "kept"),  # backwards (an agent that lost its state): still behind
        (3, 4, None, "now"),
    ],
)
def test_the_lag_clock_moves_with_the_acknowledged_version(
    write_path, reported, acked, since, expect
):
    cred = node_with_credential("gpu-01")
    Node.objects.filter(pk="gpu-01").update(
        desired_version=7, acked_version=acked, desired_lag_since=since
    )
    now = timezone.now()

    heartbeat_apply.apply_heartbeats([("gpu-01", cred, hb(desired_version=reported), now)])

    got = Node.objects.get(pk="gpu-01").desired_lag_since
    if expect == "kept":
        assert got == since
    elif expect == "now":
        assert got is not None and got >= now - timedelta(seconds=5) and got != LATER
    else:
        assert got is None


def test_a_suspect_node_is_back_and_logged_once(write_path, caplog):
    caplog.set_level(logging.INFO, logger="fleet.services")
    cred = node_with_credential("gpu-01")
    Node.objects.filter(pk="gpu-01").update(state=NodeState.SUSPECT)

    heartbeat_apply.apply_heartbeats([("gpu-01", cred, hb(), timezone.now())])
    heartbeat_apply.apply_heartbeats([("gpu-01", cred, hb(seq=2), timezone.now())])

    assert Node.objects.get(pk="gpu-01").state == NodeState.READY
    back = [r for r in caplog.records if "node back node=gpu-01 was=suspect" in r.getMessage()]
    assert len(back) == 1


def test_revoked_and_removed_are_told_apart_from_live(write_path):
    live = node_with_credential("gpu-01")
    revoked = node_with_credential("gpu-02")
    gone = node_with_credential("gpu-03")
    NodeCredential.objects.filter(pk=revoked).update(revoked_at=timezone.now())
    Node.objects.filter(pk="gpu-03").delete()
    disk = [{"path": "/var/lib/llmgw", "free_bytes": 1, "total_bytes": 2}]

    results = heartbeat_apply.apply_heartbeats(
        [
            ("gpu-01", live, hb(storage=disk, load=LOAD), timezone.now()),
            ("gpu-02", revoked, hb(), timezone.now()),
            ("gpu-03", gone, hb(storage=disk, load=LOAD), timezone.now()),
        ]
    )

    assert not results["gpu-01", live].revoked
    assert results["gpu-02", revoked].revoked and results["gpu-03", gone].revoked
    # A removed node is not brought back by its last heartbeat.
    assert not Node.objects.filter(pk="gpu-03").exists()
    assert not Storage.objects.filter(node_id="gpu-03").exists()
    assert not NodeLoad.objects.filter(node_id="gpu-03").exists()
    assert storage_of("gpu-01") == [("/var/lib/llmgw", 1, False)]


def test_gpu_memory_goes_to_gpus_in_index_order_and_later_figures_win(write_path):
    # A node showing only GPUs 2 and 5 (CUDA_VISIBLE_DEVICES): figures go by
    # position in index order, not by index; a figure beyond the GPUs is dropped.
    gpus = [dict(g, index=i) for g, i in zip(H100_GPUS[:2], (5, 2), strict=True)]
    inventory.register_node(protocol.parse_agent_message(register_msg("gpu-01", gpus=gpus)))
    cred, _ = NodeCredential.issue(node=Node.objects.get(pk="gpu-01"))
    now = timezone.now()

    heartbeat_apply.apply_heartbeats(
        [
            ("gpu-01", cred.pk, hb(seq=1, gpu_memory_used_mb=[100, 200, 300]), now),
            # A later, shorter list: the first GPU's figure is news, the second stands.
            ("gpu-01", cred.pk, hb(seq=2, gpu_memory_used_mb=[400]), now),
        ]
    )

    used = dict(GPU.objects.filter(node_id="gpu-01").values_list("index", "memory_used_mb"))
    assert used == {2: 400, 5: 200}


def test_rare_facts_ride_in_the_same_batch(write_path, caplog):
    caplog.set_level(logging.INFO, logger="fleet.services")
    a, b = node_with_credential("gpu-01"), node_with_credential("gpu-02")

    heartbeat_apply.apply_heartbeats(
        [
            ("gpu-01", a, hb(gpu_memory_used_mb=[70000] * 8, memory_total_mb=4127000, load=LOAD),
             timezone.now()),
            ("gpu-02", b, hb(new_problems=[{"gpu_index": 3, "problem": "XID 48"}],
                             engines_changed=True, engine_versions={"vllm": "0.11.0"},
                             load=LOAD), timezone.now()),
        ]
    )  # fmt: skip

    assert (
        list(GPU.objects.filter(node_id="gpu-01").values_list("memory_used_mb", flat=True))
        == [70000] * 8
    )
    assert Node.objects.get(pk="gpu-01").memory_total_mb == 4127000
    assert GPU.objects.get(node_id="gpu-02", index=3).problems == ["XID 48"]
    assert Node.objects.get(pk="gpu-02").engine_versions == {"vllm": "0.11.0"}
    assert NodeLoad.objects.count() == 2
    assert any("node memory changed node=gpu-01" in r.getMessage() for r in caplog.records)


# ---- through the agent socket -------------------------------------------------


@pytest.mark.django_db(transaction=True)
async def test_a_repeated_figure_is_written_again_after_a_register_rewrote_it():
    # The socket skips writing GPU memory and disk figures equal to the ones it
    # last wrote; a register rewrites those rows, so it must forget them.
    from tests.consumer.helpers import db, enrol, register

    def gpu_used():
        return list(
            GPU.objects.filter(node_id="gpu-01")
            .order_by("index")
            .values_list("memory_used_mb", flat=True)
        )

    agent = await enrol("gpu-01")
    disk = [{"path": "/var/lib/llmgw", "free_bytes": 5 * 10**11, "total_bytes": 2 * 10**12}]
    await agent.heartbeat(seq=1, gpu_memory_used_mb=[70000] * 8, storage=disk)
    await agent.heartbeat(seq=2, gpu_memory_used_mb=[70000] * 8, storage=disk)
    assert await db(gpu_used)() == [70000] * 8

    await register(agent.comm, "gpu-01")  # reports 0 MB used and 10**12 free
    assert await db(gpu_used)() == [0] * 8

    await agent.heartbeat(seq=3, gpu_memory_used_mb=[70000] * 8, storage=disk)
    assert await db(gpu_used)() == [70000] * 8
    assert await db(storage_of)("gpu-01") == [("/var/lib/llmgw", 5 * 10**11, False)]
    await agent.close()


# ---- the batcher ----------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
async def test_heartbeats_arriving_together_are_written_together_each_with_its_answer(
    monkeypatch,
):
    import asyncio

    from channels.db import database_sync_to_async as db

    from fleet.services.heartbeat.batching import HeartbeatBatcher

    def make_nodes():
        creds = {f"gpu-{i:02d}": node_with_credential(f"gpu-{i:02d}") for i in range(40)}
        Node.objects.filter(pk="gpu-07").update(desired_version=3)
        NodeCredential.objects.filter(node_id="gpu-09").update(revoked_at=timezone.now())
        return creds

    creds = await db(make_nodes)()
    writes = []
    apply = heartbeat_apply.apply_heartbeats
    monkeypatch.setattr(
        heartbeat_apply, "apply_heartbeats", lambda b: writes.append(len(b)) or apply(b)
    )
    batcher = HeartbeatBatcher()

    results = await asyncio.gather(*(batcher.submit(n, c, hb(load=LOAD)) for n, c in creds.items()))

    answers = dict(zip(creds, results, strict=True))
    assert answers["gpu-07"].desired_version == 3 and not answers["gpu-07"].revoked
    assert answers["gpu-09"].revoked
    assert not any(r.revoked for n, r in answers.items() if n != "gpu-09")
    assert sum(writes) == 40 and len(writes) < 40  # batched, nobody left out
    # Every node's load but the revoked one's: its heartbeat writes nothing.
    assert await db(NodeLoad.objects.count)() == 39


@pytest.mark.django_db(transaction=True)
async def test_a_failed_write_fails_its_heartbeats_and_the_next_one_goes_through(monkeypatch):
    from channels.db import database_sync_to_async as db
    from django.db import OperationalError

    from fleet.services.heartbeat.batching import HeartbeatBatcher

    cred = await db(node_with_credential)("gpu-01")
    apply = heartbeat_apply.apply_heartbeats
    failures = iter([OperationalError("server closed the connection unexpectedly")])

    def flaky(batch):
        for exc in failures:
            raise exc
        return apply(batch)

    monkeypatch.setattr(heartbeat_apply, "apply_heartbeats", flaky)
    batcher = HeartbeatBatcher()

    with pytest.raises(OperationalError):
        await batcher.submit("gpu-01", cred, hb(load=LOAD))
    result = await batcher.submit("gpu-01", cred, hb(seq=2, load={**LOAD, "cpu_percent": 2.0}))

    assert not result.revoked
    assert (await db(NodeLoad.objects.get)(node_id="gpu-01")).cpu_percent == 2.0


@pytest.mark.django_db(transaction=True)
async def test_the_writer_keeps_its_connection_while_agents_are_connected_only():
    import asyncio

    from django.db import connection

    from fleet.services.heartbeat import batching as heartbeats
    from tests.consumer.helpers import enrol

    def writer_connected() -> bool:
        return heartbeats._writer.submit(lambda: connection.connection is not None).result()

    agents = [await enrol("gpu-01"), await enrol("gpu-02")]
    await agents[0].heartbeat(seq=1, load=LOAD)
    await agents[1].heartbeat(seq=1, load=LOAD)
    # Between heartbeats the writer is idle, and keeps its connection for the next.
    assert await asyncio.to_thread(writer_connected)

    await agents[0].close()
    assert await asyncio.to_thread(writer_connected)
    await agents[1].close()
    # The last agent gone: nothing holds a database connection for heartbeats.
    assert not await asyncio.to_thread(writer_connected)


def test_the_load_columns_are_named_once_for_protocol_models_and_both_writers():
    # The two writers take their load columns from heartbeat/columns.py: a field
    # added to the protocol's Load must be added there, and to the model.
    from fleet.services.heartbeat.columns import NODE_LOAD, SHARD_LOAD

    def model_columns(model, *bookkeeping):
        return [f.name for f in model._meta.concrete_fields if f.name not in bookkeeping]

    node_cols = [name for name, _ in NODE_LOAD]
    assert node_cols == [f for f in protocol.Load.model_fields if f != "shards"]
    assert node_cols == model_columns(NodeLoad, "id", "node", "sampled_at")
    shard_cols = [name for name, _ in SHARD_LOAD]
    assert shard_cols == [f for f in protocol.ShardLoad.model_fields if f != "shard_id"]
    assert shard_cols == model_columns(ShardLoad, "id", "node", "shard_id", "sampled_at")


def test_the_idle_janitor_ends_quietly_when_the_process_shuts_its_writer(monkeypatch):
    # Daphne stopping shuts the executors down while the janitor thread sleeps:
    # its next submit must end the thread, not print a traceback at every exit.
    from concurrent.futures import ThreadPoolExecutor

    from fleet.services.heartbeat import batching

    writer = ThreadPoolExecutor(max_workers=1)
    writer.shutdown()
    monkeypatch.setattr(batching, "_writer", writer)
    monkeypatch.setattr(batching, "_last_write", 0.0)
    monkeypatch.setattr(batching.time, "sleep", lambda s: None)
    errors = []
    thread = threading.Thread(target=lambda: _run_catching(batching._janitor_loop, errors))
    thread.start()
    thread.join(5)
    assert not thread.is_alive() and errors == []


def _run_catching(fn, errors):
    try:
        fn()
    except Exception as exc:  # noqa: BLE001 - the test reports it
        errors.append(exc)


# ---- beside the reconciler's writes --------------------------------------------------

if ON_POSTGRES:

    @pytest.mark.django_db(transaction=True)
    def test_a_batch_and_a_pass_writing_the_same_nodes_both_finish():
        # The reconciler holds one node and then wants the others; a heartbeat
        # batch names them all. Rows taken in whatever order the statement's plan
        # found them, the two deadlocked and PostgreSQL failed one: every socket
        # of the batch ended (seen with 5,000 agents as 200 replicas were placed).
        from django.db import connection, transaction

        from fleet.services.desired import locked_nodes

        nodes = [f"gpu-{i:02}" for i in range(20)]
        creds = {n: node_with_credential(n) for n in nodes}
        holding, waiting = threading.Event(), threading.Event()
        outcome: dict[str, object] = {}

        def reconciler():
            try:
                with transaction.atomic(), locked_nodes(nodes[:1]):
                    holding.set()
                    waiting.wait(5)
                    time.sleep(0.5)  # the batch is inside its statement by now
                    with connection.cursor() as cur:
                        cur.execute("SET LOCAL deadlock_timeout = '100ms'")
                        cur.execute("SET LOCAL lock_timeout = '10s'")
                    with locked_nodes(nodes[1:]):
                        pass
                outcome["reconciler"] = "done"
            except Exception as exc:  # noqa: BLE001 - the assertion names it
                outcome["reconciler"] = exc
            finally:
                connection.close()

        def batch():
            holding.wait(5)
            waiting.set()
            try:
                now = timezone.now()
                written = heartbeat_apply.apply_heartbeats(
                    [(n, creds[n], hb(), now) for n in reversed(nodes)]
                )
                outcome["batch"] = sorted(node for node, _ in written)
            except Exception as exc:  # noqa: BLE001 - the assertion names it
                outcome["batch"] = exc
            finally:
                connection.close()

        threads = [threading.Thread(target=reconciler), threading.Thread(target=batch)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert outcome == {"reconciler": "done", "batch": nodes}
