"""Who holds what of the fleet now, and how an interval is cut at hours: pure tables."""

from datetime import UTC, datetime

import pytest

from fleet.services.costs.accrual import pieces
from fleet.services.costs.attribution import GpuFact, Holder, NodeFact, Owner, attribute

H100 = "NVIDIA H100 80GB HBM3"
L4 = "NVIDIA L4"
MIB_80 = 81920  # an 80 GiB GPU, so that shares in GiB are round fractions


def gpus(node, n, name=H100, memory=MIB_80):
    return [GpuFact(node, f"{node}-{i}", name, memory) for i in range(n)]


def held(model, team="", gpu=H100):
    return Owner(False, gpu, model, team)


def idle(gpu=H100):
    return Owner(True, gpu)


CASES = [
    pytest.param(
        [NodeFact("n1", 64000)],
        gpus("n1", 2),
        [Holder("n1", ("n1-0",), "llama", "research")],
        {held("llama", "research"): 1.0, idle(): 1.0},
        id="a whole GPU is its holder's; the other is idle",
    ),
    pytest.param(
        [NodeFact("n1", 64000)],
        gpus("n1", 4),
        [Holder("n1", ("n1-0", "n1-1", "n1-2", "n1-3"), "llama-70b", "research")],
        {held("llama-70b", "research"): 4.0},
        id="tensor parallel over four GPUs holds four",
    ),
    pytest.param(
        [NodeFact("n1", 64000)],
        gpus("n1", 1),
        [
            Holder("n1", ("n1-0",), "small", "research", share_gb=40),
            Holder("n1", ("n1-0",), "tiny", "vision", share_gb=20),
        ],
        {held("small", "research"): 0.5, held("tiny", "vision"): 0.25, idle(): 0.25},
        id="shares count their memory over the GPU's; the rest is idle",
    ),
    pytest.param(
        [NodeFact("n1", 64000)],
        gpus("n1", 1),
        [Holder("n1", ("n1-0",), m, "t", share_gb=40) for m in ("a", "b", "c")],
        {held(m, "t"): 1 / 3 for m in ("a", "b", "c")},
        id="over-committed shares are scaled to one GPU, never more",
    ),
    pytest.param(
        [NodeFact("n1", 64000)],
        gpus("n1", 1),
        [
            Holder("n1", ("n1-0",), "sleepy", "research", share_gb=40, asleep=True),
            Holder("n1", ("n1-0",), "awake", "vision", share_gb=40),
        ],
        {held("awake", "vision"): 0.5, idle(): 0.5},
        id="an asleep replica holds no GPU: what it gave back is idle",
    ),
    pytest.param(
        [NodeFact("cpu1", 64000), NodeFact("cpu2", 64000)],
        [],
        [
            Holder("cpu1", (), "llama-cpu", "research", host_gb=16),
            Holder("cpu2", (), "qwen-cpu", "", host_gb=None),
        ],
        {held("llama-cpu", "research", ""): 0.25, idle(""): 0.75, held("qwen-cpu", "", ""): 1},
        id="a CPU-only node's hour: its memory shares, or the whole node where unknown",
    ),
    pytest.param(
        [NodeFact("n1", 64000)],
        gpus("n1", 2),
        [Holder("n1", (), "llama-cpu", "research", host_gb=16)],
        {idle(): 2.0},
        id="a CPU replica on a GPU node counts nothing: the node is priced by its GPUs",
    ),
    pytest.param(
        [NodeFact("n1", 64000)],
        gpus("n1", 1) + gpus("lost", 8),
        [Holder("lost", ("lost-0",), "llama", "research"), Holder("n1", ("gone",), "x")],
        {idle(): 1.0},
        id="a lost node's GPUs and a GPU no longer reported count for nobody",
    ),
    pytest.param(
        [NodeFact("n1", 64000), NodeFact("n2", 64000)],
        gpus("n1", 2) + gpus("n2", 2, L4, 23034),
        [
            Holder("n1", ("n1-0", "n1-1"), "big", "research"),
            Holder("n2", ("n2-0",), "big", "research"),
        ],
        {held("big", "research"): 2.0, held("big", "research", L4): 1.0, idle(L4): 1.0},
        id="a replica over two nodes holds each node's GPUs under their own class",
    ),
]


@pytest.mark.parametrize("nodes,gpu_facts,holders,want", CASES)
def test_attribution(nodes, gpu_facts, holders, want):
    got = attribute(nodes, gpu_facts, holders)
    assert got == pytest.approx(want)
    # Every GPU of a counted node, and every CPU-only node, is held or idle exactly once.
    counted = {n.id for n in nodes}
    with_gpus = {g.node for g in gpu_facts}
    fleet = sum(1 for g in gpu_facts if g.node in counted) + len(counted - with_gpus)
    assert sum(got.values()) == pytest.approx(fleet)


def t(h, m=0, s=0):
    return datetime(2026, 12, 7, h, m, s, tzinfo=UTC)


@pytest.mark.parametrize(
    "start,end,want",
    [
        (t(10, 0), t(10, 1), [(t(10), 60.0)]),
        (t(10, 59, 30), t(11, 0, 30), [(t(10), 30.0), (t(11), 30.0)]),
        (t(10, 30), t(12, 30), [(t(10), 1800.0), (t(11), 3600.0), (t(12), 1800.0)]),
        (t(11), t(11), []),
    ],
    ids=["within an hour", "across a boundary", "across two", "nothing"],
)
def test_an_interval_is_cut_at_each_hour(start, end, want):
    assert pieces(start, end) == want
