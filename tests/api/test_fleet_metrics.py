"""The fleet gauges on /metrics: the Go system's names, fresh samples only, unknown left out."""

from datetime import timedelta

import pytest
from prometheus_client.parser import text_string_to_metric_families

from fleet import metrics
from tests.factories import (
    LLAMACPP_CPU,
    add_model,
    add_node,
    add_replica,
    report_gpu_events,
    report_load,
)

pytestmark = pytest.mark.django_db


def scrape() -> dict:
    """{(name, frozenset(labels)): value} of the fleet gauges, as Prometheus would read them."""
    out = {}
    for family in text_string_to_metric_families(metrics.render().decode()):
        for sample in family.samples:
            if sample.name in metrics.FLEET_GAUGES:
                out[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return out


def test_a_node_and_its_engine_are_measured_under_the_go_names():
    # given a node running a replica, and a heartbeat with its load
    add_node("gpu-01", memory_total_mb=2063500, as_reported=True)
    model = add_model("qwen-7b", **LLAMACPP_CPU)
    profile = model.active_profile
    shard = add_replica(model, profile, ["gpu-01"]).shards.get()
    report_load("gpu-01", shards=[{"shard_id": shard.pk, "cpu_cores": 1.5, "rss_bytes": 2**33}])

    got = scrape()

    node = frozenset({("node", "gpu-01")})
    engine = frozenset({("node", "gpu-01"), ("shard", shard.pk), ("model", "qwen-7b")})
    assert got[("llmgw_node_cpu_utilization_percent", node)] == 37.5
    assert got[("llmgw_node_cpus", node)] == 224
    assert got[("llmgw_node_load", node | {("window", "1m")})] == 3.5
    assert got[("llmgw_node_load", node | {("window", "15m")})] == 2.5
    assert got[("llmgw_node_memory_bytes", node)] == 2063500 * 2**20
    assert got[("llmgw_node_memory_used_bytes", node)] == 412 * 2**30
    assert got[("llmgw_node_memory_available_bytes", node)] == 1600 * 2**30
    assert got[("llmgw_shard_cpu_cores", engine)] == 1.5
    assert got[("llmgw_shard_memory_bytes", engine)] == 2**33
    # A CPU engine has no GPU figures (tests/api/test_gpu_budget_use.py has them).
    gpu_only = {n for n in metrics.FLEET_GAUGES if "_gpu_" in n}
    assert len(gpu_only) == 3
    assert {name for name, _ in got} == set(metrics.FLEET_GAUGES) - gpu_only


def test_a_stale_sample_is_left_out_and_unknown_memory_is_not_zero():
    # given one node heard from two minutes ago, one that never said its memory
    add_node("gpu-01", as_reported=True)
    report_load(
        "gpu-01",
        age=timedelta(minutes=2),
        shards=[{"shard_id": "s-1", "cpu_cores": 2, "rss_bytes": 2**30}],
    )
    add_node("cpu-01", gpus=[], fabrics=[], memory_total_mb=None, as_reported=True)
    report_load("cpu-01", cpu_percent=5.0)

    got = scrape()

    nodes = {dict(labels)["node"] for name, labels in got if name != "llmgw_node_memory_bytes"}
    assert nodes == {"cpu-01"}
    assert ("llmgw_node_memory_bytes", frozenset({("node", "cpu-01")})) not in got
    assert ("llmgw_node_memory_bytes", frozenset({("node", "gpu-01")})) in got
    assert not any(name.startswith("llmgw_shard_") for name, _ in got)


def gpu_samples() -> dict:
    """{(name, labels): value} of the GPU health and XID metrics, as Prometheus reads them."""
    out = {}
    for family in text_string_to_metric_families(metrics.render().decode()):
        for sample in family.samples:
            if sample.name in ("llmgw_gpu_health", "llmgw_gpu_xid_total"):
                out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def test_gpus_are_counted_by_health_and_their_xids_summed_over_the_fleet():
    # given no GPUs: every state is there, at 0 (an alert on failed > 0 needs the series)
    assert gpu_samples() == {
        ("llmgw_gpu_health", (("state", s),)): 0 for s in ("healthy", "degraded", "failed")
    }

    # given two nodes of 8 GPUs: one fell off the bus, one had a contained ECC error (94,
    # degraded), and both nodes saw application faults (13, watched)
    add_node("gpu-01")
    add_node("gpu-02")
    report_gpu_events("gpu-01", (0, "xid", 79), (1, "xid", 13), (1, "xid", 13))
    report_gpu_events("gpu-02", (4, "xid", 94), (5, "xid", 13))

    got = gpu_samples()

    assert got == {
        ("llmgw_gpu_health", (("state", "healthy"),)): 14,
        ("llmgw_gpu_health", (("state", "degraded"),)): 1,
        ("llmgw_gpu_health", (("state", "failed"),)): 1,
        ("llmgw_gpu_xid_total", (("xid", "13"),)): 3,
        ("llmgw_gpu_xid_total", (("xid", "79"),)): 1,
        ("llmgw_gpu_xid_total", (("xid", "94"),)): 1,
    }
    families = {f.name: f.type for f in text_string_to_metric_families(metrics.render().decode())}
    assert families["llmgw_gpu_health"] == "gauge"
    assert families["llmgw_gpu_xid"] == "counter"  # exposed as llmgw_gpu_xid_total
