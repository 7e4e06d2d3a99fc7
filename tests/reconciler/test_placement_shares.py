"""Shares of a GPU (a profile's gpu_memory_gb) as a pure function: tables, no database.

Each GPU is counted: its total, less the reserve, less what other processes use,
less what shares were promised there. A whole GPU is never shared, and a shared
GPU is never handed out whole.
"""

import pytest

from fleet.services.placement import Snapshot, place
from fleet.services.placement_types import GpuInfo, NoPlacement, Placement, Request
from tests.reconciler.test_placement import gpus, node

GB = 1024  # GPU memory is in MiB, a GB of it 1,024 (fleet/services/units.py)
H100 = 80 * GB  # an H100 80GB, rounded here to the GB


def share(gb, n=1, **kw):
    kw.setdefault("engine", "vllm")
    return Request(model="m", gpus_per_node=n, gpu_memory_mb=round(gb * GB), **kw)


def whole(n=1):
    return Request(model="m", engine="vllm", gpus_per_node=n)


def card(i, total=H100, promised=0, other=0, nvlink=()):
    return GpuInfo(
        uuid=f"GPU-{i}",
        index=i,
        name="NVIDIA H100 80GB HBM3",
        nvlink_peers=frozenset(nvlink),
        memory_mb=total,
        promised_mb=promised,
        other_mb=other,
    )


def snap(*nodes, reserve_gb=1):
    return Snapshot(list(nodes), gpu_reserve_mb=reserve_gb * GB)


def test_two_shares_go_on_one_gpu_and_the_others_stay_whole():
    s = snap(node("gpu-01", gpus=[card(0), card(1)]))
    first = place(s, share(30))
    s.commit(first, share(30))
    second = place(s, share(30))
    s.commit(second, share(30))
    assert first.shards[0].gpu_uuids == second.shards[0].gpu_uuids == ("GPU-0",)
    # the untouched GPU is still whole, for a model that needs one
    big = place(s, whole())
    assert isinstance(big, Placement) and big.shards[0].gpu_uuids == ("GPU-1",)


def test_a_gpu_never_promises_more_than_it_holds_less_the_reserve_and_others_use():
    # 80 GB, 1 reserved, 12.4 used by another process, 30 promised: 36.6 left
    gpu = card(3, promised=30 * GB, other=round(12.4 * GB))
    s = snap(node("gpu-07", gpus=[gpu]))
    assert isinstance(place(s, share(36.6)), Placement)
    refused = place(s, share(40))
    assert isinstance(refused, NoPlacement)
    assert refused.reasons[0].text == (
        "gpu-07 GPU 3: 30.0 of 80.0 GB promised, 12.4 GB used by other processes, "
        "1.0 GB reserved, needs 40.0"
    )
    assert refused.reasons[0].kind == "gpu_memory"


def test_the_reserve_is_the_operators_setting():
    s = snap(node("gpu-01", gpus=[card(0)]), reserve_gb=10)
    assert isinstance(place(s, share(70)), Placement)
    assert isinstance(place(s, share(70.5)), NoPlacement)


@pytest.mark.parametrize(
    "held, asked, fits",
    [
        ("whole", "share", False),  # a GPU a whole-GPU shard holds is not shared
        ("share", "whole", False),  # a GPU with a share is not handed out whole
        ("share", "share", True),
    ],
)
def test_whole_gpus_are_never_shared(held, asked, fits):
    n = node("gpu-01", gpus=[card(0)])
    s = snap(n)
    first = share(20) if held == "share" else whole()
    s.commit(place(s, first), first)
    assert isinstance(place(s, share(20) if asked == "share" else whole()), Placement) is fits


def test_packing_fills_shared_gpus_first_and_spreading_takes_the_emptiest():
    s = snap(node("gpu-01", gpus=[card(0), card(1, promised=40 * GB), card(2, promised=10 * GB)]))
    # packing: the fullest GPU that still has room
    assert place(s, share(30)).shards[0].gpu_uuids == ("GPU-1",)
    # spreading: the most room
    assert place(s, share(30, policy="spread")).shards[0].gpu_uuids == ("GPU-0",)


def test_packing_prefers_a_node_whose_gpus_are_shared_to_one_with_whole_gpus_free():
    busy = node("a-busy", gpus=[card(0, promised=20 * GB), card(1)])
    empty = node("b-empty", gpus=[card(0), card(1)])
    got = place(snap(empty, busy), share(20))
    assert got.shards[0].node_id == "a-busy" and got.shards[0].gpu_uuids == ("GPU-0",)


def test_tensor_parallel_takes_its_share_on_each_gpu_an_nvlink_set_first():
    gs = [card(0, nvlink={2}), card(1), card(2, nvlink={0})]
    s = snap(node("gpu-01", gpus=gs))
    got = place(s, share(30, n=2, tp=2))
    assert set(got.shards[0].gpu_uuids) == {"GPU-0", "GPU-2"} and got.shards[0].nvlink
    s.commit(got, share(30, n=2, tp=2))
    assert [g.promised_mb for g in gs] == [30 * GB, 0, 30 * GB]


def test_a_tensor_parallel_share_needs_room_on_as_many_gpus_and_says_how_many_have_it():
    s = snap(node("gpu-01", gpus=[card(0), card(1, promised=60 * GB)]))
    refused = place(s, share(30, n=2, tp=2))
    assert isinstance(refused, NoPlacement)
    assert refused.reasons[0].text.startswith("gpu-01: 1 of the 2 GPUs needed have room; ")
    assert "gpu-01 GPU 1: 60.0 of 80.0 GB promised" in refused.reasons[0].text


def test_a_stopped_share_gives_its_memory_back():
    gs = [card(0)]
    s = snap(node("gpu-01", gpus=gs))
    p = place(s, share(50))
    s.commit(p, share(50))
    assert isinstance(place(s, share(50)), NoPlacement)
    s.release("gpu-01", p.shards[0].gpu_uuids, p.shards[0].port, 0, gpu_memory_mb=50 * GB)
    assert gs[0].promised_mb == 0 and isinstance(place(s, share(50)), Placement)


def test_a_gpu_held_whole_by_a_shard_is_named_so():
    n = node("gpu-01", gpus=gpus(1))
    s = snap(n)
    s.commit(place(s, whole()), whole())
    refused = place(s, share(10))
    assert refused.reasons[0].text == "gpu-01: every GPU is held whole"
