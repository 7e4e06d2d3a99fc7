"""Placement as a pure function: tables of nodes and requests, no database."""

import pytest

from fleet.selectors import parse_selector
from fleet.services.placement import Snapshot, explain, place
from fleet.services.placement_types import GpuInfo, NodeInfo, NoPlacement, Placement, Request
from fleet.services.units import gb_text

GB = 1000  # MB in a GB, as placement counts them (fleet/services/units.py)


def gpus(n=8, name="NVIDIA H100 80GB HBM3", nvlink=True, problems=()):
    return [
        GpuInfo(
            uuid=f"GPU-{i:08x}-aaaa",
            index=i,
            name=name,
            healthy=i not in problems,
            nvlink_peers=frozenset(j for j in range(n) if j != i) if nvlink else frozenset(),
            numa_node=0 if i < n // 2 else 1,
        )
        for i in range(n)
    ]


def node(nid, **kw):
    kw.setdefault("engines", {"llamacpp": "0.3.16", "vllm": "0.11.0", "fake": "1"})
    return NodeInfo(id=nid, **kw)


def req(**kw):
    sel = kw.pop("selector", "")
    kw.setdefault("engine", "llamacpp")
    return Request(model="m", selector=tuple(parse_selector(sel)), selector_text=sel, **kw)


# (name, nodes, request, the node chosen or None, text every reason must contain)
CASES = [
    (
        "seed: 24 GB profile refuses an 8 GB node",
        [node("gpu-07", memory_mb=8 * GB)],
        req(min_memory_gb=24),
        None,
        ["gpu-07: has 8 GB of memory, needs 24"],
    ),
    (
        "seed: a node that reports no memory still fits",
        [node("old-agent", memory_mb=None)],
        req(min_memory_gb=24),
        "old-agent",
        [],
    ),
    (
        "seed: no requirement fits anywhere",
        [node("small", memory_mb=2 * GB)],
        req(),
        "small",
        [],
    ),
    (
        "seed: the memory filter picks the big node",
        [node("gpu-07", memory_mb=8 * GB), node("gpu-08", memory_mb=64 * GB)],
        req(min_memory_gb=24),
        "gpu-08",
        [],
    ),
    (
        "seed: a label selector still applies on top of memory",
        [
            node("big-general", memory_mb=64 * GB, labels={"role": "general"}),
            node("big-coding", memory_mb=64 * GB, labels={"role": "coding"}),
            node("small-coding", memory_mb=8 * GB, labels={"role": "coding"}),
        ],
        req(min_memory_gb=24, selector="role=coding"),
        "big-coding",
        [],
    ),
    (
        "a selector nobody matches names the term",
        [node("a", labels={"zone": "a"})],
        req(selector="zone=b"),
        None,
        ["a: labels do not match 'zone=b' of 'zone=b'"],
    ),
    (
        "suspect, lost, disconnected, cordoned and draining nodes are out",
        [
            node("s", state="suspect"),
            node("l", state="lost"),
            node("d", connected=False),
            node("c", cordoned=True),
            node("dr", cordoned=True, draining=True),
        ],
        req(),
        None,
        ["s: is suspect", "l: is lost", "d: no agent connected", "c: cordoned", "dr: draining"],
    ),
    (
        "the engine must be installed",
        [node("cpu-1", engines={"llamacpp": "0.3.16"})],
        req(engine="vllm", gpus_per_node=1),
        None,
        ["cpu-1: engine 'vllm' is not installed"],
    ),
    (
        "GPU class is a substring of the GPU name",
        [
            node("a100", gpus=gpus(8, "NVIDIA A100-SXM4-80GB")),
            node("h200", gpus=gpus(8, "NVIDIA H200")),
        ],
        req(engine="vllm", gpus_per_node=8, tp=8, gpu_class="H200"),
        "h200",
        [],
    ),
    (
        "a GPU with problems is out",
        [node("sick", gpus=gpus(8, problems=(3,)))],
        req(engine="vllm", gpus_per_node=8, tp=8),
        None,
        ["sick: has 8 GPUs (1 with problems), needs 8 healthy"],
    ),
    (
        "used GPUs are not free",
        [node("busy", gpus=gpus(8), used_gpus={f"GPU-{i:08x}-aaaa" for i in range(6)})],
        req(engine="vllm", gpus_per_node=4, tp=4),
        None,
        ["busy: has 2 free GPUs, needs 4"],
    ),
    (
        "memory promised to other shards counts",
        [node("cpu", memory_mb=32 * GB, promised_mb=24000)],
        req(min_memory_gb=16),
        None,
        ["cpu: has 32 GB of memory, 24 GB promised to other shards, needs 16"],
    ),
    (
        "a full port range is a reason",
        [node("p", port_range=(31000, 31001), used_ports={31000, 31001})],
        req(),
        None,
        ["p: no free port in 31000-31001"],
    ),
    (
        "binpack takes the busiest node that fits",
        [
            node("empty", gpus=gpus(8)),
            node("half", gpus=gpus(8), used_gpus={f"GPU-{i:08x}-aaaa" for i in range(4)}),
        ],
        req(engine="vllm", gpus_per_node=2, tp=2),
        "half",
        [],
    ),
    (
        "spread takes the emptiest node",
        [
            node("half", gpus=gpus(8), used_gpus={f"GPU-{i:08x}-aaaa" for i in range(4)}),
            node("empty", gpus=gpus(8)),
        ],
        req(engine="vllm", gpus_per_node=2, tp=2, policy="spread"),
        "empty",
        [],
    ),
    (
        "nodes holding the weights win over the policy",
        [
            node("half", gpus=gpus(8), used_gpus={f"GPU-{i:08x}-aaaa" for i in range(4)}),
            node("cached", gpus=gpus(8), weights=frozenset({"/models/Qwen/Qwen2.5-7B"})),
        ],
        req(engine="vllm", gpus_per_node=2, tp=2, model_path="Qwen/Qwen2.5-7B"),
        "cached",
        [],
    ),
    (
        "Hugging Face's cache layout counts as holding the weights",
        [
            node("a", memory_mb=64 * GB),
            node(
                "hf", weights=frozenset({"/root/.cache/huggingface/hub/models--Qwen--Qwen2.5-7B"})
            ),
        ],
        req(model_path="Qwen/Qwen2.5-7B"),
        "hf",
        [],
    ),
    (
        "an NVLink-connected set wins for tensor parallelism",
        [node("pcie", gpus=gpus(8, nvlink=False)), node("sxm", gpus=gpus(8))],
        req(engine="vllm", gpus_per_node=4, tp=4),
        "sxm",
        [],
    ),
    (
        "without NVLink anywhere the PCIe node still serves",
        [node("pcie", gpus=gpus(8, nvlink=False))],
        req(engine="vllm", gpus_per_node=4, tp=4),
        "pcie",
        [],
    ),
    (
        "a node the replica failed on too often is tried last",
        [node("bad"), node("good")],
        req(avoid=(("bad", 3),), prefer=("bad",)),
        "good",
        [],
    ),
    (
        "the failed node is still used when nothing else fits",
        [node("bad"), node("other", cordoned=True)],
        req(avoid=(("bad", 3),)),
        "bad",
        [],
    ),
    (
        "a restart prefers the node it ran on",
        [node("a"), node("b", weights=frozenset({"/w/m"}))],
        req(prefer=("a",), model_path="/w/m"),
        "a",
        [],
    ),
]


@pytest.mark.parametrize(
    "nodes,request_,chosen,reasons", [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_place(nodes, request_, chosen, reasons):
    result = place(Snapshot(nodes), request_)
    if chosen is None:
        assert isinstance(result, NoPlacement)
        for text in reasons:
            assert text in result.summary
    else:
        assert isinstance(result, Placement), result.summary
        assert result.node_ids == [chosen]


def test_gpus_ports_and_nvlink_of_a_placement():
    snap = Snapshot([node("gpu-01", gpus=gpus(8), used_ports={30000})])
    r = req(engine="vllm", gpus_per_node=4, tp=4)

    first = place(snap, r)
    snap.commit(first, r)
    second = place(snap, r)
    snap.commit(second, r)
    third = place(snap, r)

    a, b = first.shards[0], second.shards[0]
    assert len(a.gpu_uuids) == 4 and a.nvlink
    assert not set(a.gpu_uuids) & set(b.gpu_uuids)
    assert (a.port, b.port) == (30001, 30002)  # 30000 was taken already
    assert isinstance(third, NoPlacement)
    assert "gpu-01: has 0 free GPUs, needs 4" in third.summary


def test_released_gpus_are_free_again():
    snap = Snapshot([node("gpu-01", gpus=gpus(8))])
    r = req(engine="vllm", gpus_per_node=8, tp=8)
    p = place(snap, r)
    snap.commit(p, r)
    assert isinstance(place(snap, r), NoPlacement)

    snap.release("gpu-01", p.shards[0].gpu_uuids, p.shards[0].port, r.need_mb)

    assert isinstance(place(snap, r), Placement)


def test_multi_node_needs_nodes_sharing_a_fabric_with_hcas():
    ib = {"ib0": ["mlx5_0", "mlx5_1"]}
    snap = Snapshot(
        [
            node("a", gpus=gpus(8), fabrics=ib),
            node("b", gpus=gpus(8), fabrics={"ib1": ["mlx5_0"]}),
            node("c", gpus=gpus(8), fabrics=ib),
            node("d", gpus=gpus(8)),
        ]
    )
    r = req(engine="vllm", gpus_per_node=8, nodes=2, tp=8)

    p = place(snap, r)

    assert isinstance(p, Placement)
    assert p.fabric == "ib0"
    assert sorted(p.node_ids) == ["a", "c"]
    assert [s.rank for s in p.shards] == [0, 1]
    assert all(s.hcas == ("mlx5_0", "mlx5_1") for s in p.shards)


def test_multi_node_without_enough_nodes_on_one_fabric_says_so():
    snap = Snapshot(
        [
            node("a", gpus=gpus(8), fabrics={"ib0": ["mlx5_0"]}),
            node("b", gpus=gpus(8), fabrics={"ib1": ["mlx5_0"]}),
            node("c", gpus=gpus(8)),
        ]
    )
    result = place(snap, req(engine="vllm", gpus_per_node=8, nodes=2, tp=8))

    assert isinstance(result, NoPlacement)
    assert result.summary == (
        "needs 2 nodes with 8 GPUs each on one fabric: 1 found on ib0, ib1 — c: is on no fabric"
    )


def test_a_llamacpp_group_needs_no_fabric_and_its_ranks_follow_weights_and_load():
    snap = Snapshot([node("a"), node("b", cordoned=True), node("c"), node("d")])

    p = place(snap, req(engine="llamacpp", nodes=3, model_path="/m/tiny.gguf"))

    assert isinstance(p, Placement)
    assert len(set(p.node_ids)) == 3 and "b" not in p.node_ids
    assert [s.rank for s in p.shards] == [0, 1, 2]
    assert p.fabric == "" and all(s.hcas == () for s in p.shards)


def test_a_llamacpp_group_too_big_for_the_fleet_says_how_many_fit_and_why_not_the_rest():
    snap = Snapshot([node("a", memory_mb=64 * GB), node("b", memory_mb=8 * GB)])

    result = place(snap, req(engine="llamacpp", nodes=2, min_memory_gb=24))

    assert isinstance(result, NoPlacement)
    assert result.summary == (
        "needs 2 nodes with 24 GB of memory each on the management network: 1 found — "
        "b: has 8 GB of memory, needs 24"
    )


def test_a_big_fleet_is_summarised_by_kind_with_an_example():
    nodes = [node(f"small-{i:02d}", memory_mb=8 * GB) for i in range(20)]
    nodes += [node(f"cord-{i:02d}", cordoned=True) for i in range(5)]
    result = place(Snapshot(nodes), req(min_memory_gb=24))

    assert result.summary == (
        "none of 25 nodes fits: 20 have too little memory, e.g. small-00: has 8 GB of memory, "
        "needs 24; 5 are cordoned, e.g. cord-00: cordoned"
    )


def test_no_nodes_at_all():
    assert place(Snapshot([]), req()).summary == "no nodes are registered"


def test_explain_lists_every_node():
    snap = Snapshot(
        [
            node("gpu-07", memory_mb=8 * GB),
            node("gpu-08", memory_mb=64 * GB, weights=frozenset({"/w/qwen"})),
            node("old", memory_mb=None),
        ]
    )
    verdicts, result = explain(snap, req(min_memory_gb=24, model_path="/w/qwen"))

    assert [(v.node_id, v.fits) for v in verdicts] == [
        ("gpu-07", False),
        ("gpu-08", True),
        ("old", True),
    ]
    assert verdicts[0].text == "gpu-07: has 8 GB of memory, needs 24"
    assert "holds the weights" in verdicts[1].text
    assert "memory not reported" in verdicts[2].text
    assert result.node_ids == ["gpu-08"]


@pytest.mark.parametrize(
    "memory_mb, fits, reason",
    [
        (7_900, False, "gpu-07: has 7.9 GB of memory, needs 8"),
        (7_999, False, "gpu-07: has 7.9 GB of memory, needs 8"),
        (8_000, True, None),
        (8_192, True, None),  # a node of 8 GiB
    ],
)
def test_memory_message_and_decision_agree_at_the_boundary(memory_mb, fits, reason):
    # One divisor for both: a refused node never reads as if it had enough.
    result = place(Snapshot([node("gpu-07", memory_mb=memory_mb)]), req(min_memory_gb=8))

    assert isinstance(result, Placement) == fits
    if reason:
        assert [r.text for r in result.reasons] == [reason]


@pytest.mark.parametrize(
    "mb, text",
    [(0, "0"), (8_000, "8"), (7_900, "7.9"), (7_999, "7.9"), (8_192, "8.1"), (2_063_597, "2063.5")],
)
def test_gigabytes_for_people_are_whole_or_rounded_down_to_a_tenth(mb, text):
    assert gb_text(mb) == text


def test_a_group_uses_a_node_it_failed_on_only_when_no_other_completes_it():
    snap = Snapshot([node("a"), node("b"), node("c")])
    failed_on_b = req(engine="llamacpp", nodes=2, avoid=(("b", 3),))

    assert sorted(place(snap, failed_on_b).node_ids) == ["a", "c"]
    # two nodes only: the one it failed on is the last resort, not a reason to wait
    two = Snapshot([node("a"), node("b")])
    assert sorted(place(two, failed_on_b).node_ids) == ["a", "b"]
