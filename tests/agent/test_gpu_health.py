"""GPU health: the XID table, health from events and problems, and the event watcher
against the NVML double."""

import os
import threading
import time
from pathlib import Path

import pynvml
import pytest

from agentd import nvml
from agentd.nvml import NVML, Checks
from agentd.nvml_double import FakeNVML
from agentd.xid import (
    DOUBLE_BIT_ECC_EVENT,
    XID_EVENT,
    Action,
    GPUEvent,
    Health,
    health,
    lookup,
)
from tests.agent import nvml_data

UUID0 = nvml_data.gpu(0)["uuid"]


@pytest.fixture
def fake(tmp_path, monkeypatch):
    """Point agentd/nvml.py at a spec file; returns a function that (re)writes it whole,
    so a watcher waiting in another thread never reads half of it."""
    path = tmp_path / "nvml.json"
    stamp = [time.time_ns()]

    def use(spec: dict) -> Path:
        tmp = nvml_data.write(tmp_path / "nvml.json.tmp", spec)
        # A fresh mtime each time, even within the filesystem's timestamp granularity.
        stamp[0] += 1_000_000
        os.utime(tmp, ns=(stamp[0], stamp[0]))
        tmp.replace(path)
        return path

    monkeypatch.setenv(nvml.FAKE_ENV, str(path))
    return use


def xid(number: int, index: int = 0) -> GPUEvent:
    return GPUEvent(index=index, uuid=UUID0, kind=XID_EVENT, xid=number)


# ---- the table ----------------------------------------------------------------


@pytest.mark.parametrize(
    "number, action",
    [
        (13, Action.WATCH),
        (31, Action.WATCH),
        (43, Action.WATCH),
        (45, Action.WATCH),
        (48, Action.FAIL),
        (61, Action.DRAIN),
        (62, Action.DRAIN),
        (63, Action.WATCH),
        (64, Action.FAIL),
        (74, Action.DRAIN),
        (79, Action.FAIL),
        (92, Action.DRAIN),
        (94, Action.DRAIN),
        (95, Action.FAIL),
        (119, Action.FAIL),
        (120, Action.FAIL),
        (9999, Action.WATCH),  # not in the table
    ],
)
def test_each_xid_has_its_action(number, action):
    assert lookup(number).action is action


# ---- health -------------------------------------------------------------------


@pytest.mark.parametrize(
    "events, problems, slowdowns, state, reason",
    [
        ([], [], [], Health.HEALTHY, ""),
        # An engine's own fault leaves the GPU healthy.
        ([xid(13), xid(31), xid(43), xid(45)], [], [], Health.HEALTHY, ""),
        ([xid(12345)], [], [], Health.HEALTHY, ""),
        ([xid(79)], [], [], Health.FAILED, "XID 79: GPU has fallen off the bus"),
        ([xid(48)], [], [], Health.FAILED, "XID 48: Double Bit ECC Error"),
        ([xid(94)], [], [], Health.DEGRADED, "XID 94: Contained ECC error"),
        ([xid(74)], [], [], Health.DEGRADED, "XID 74: NVLink error"),
        ([xid(119)], [], [], Health.FAILED, "XID 119: GSP RPC timeout"),
        # The worst decides; the cause comes before what it left behind.
        ([xid(94), xid(95)], [], [], Health.FAILED, "XID 95: Uncontained ECC error"),
        (
            [xid(79)],
            ["unreadable through NVML: GPU is lost"],
            [],
            Health.FAILED,
            "XID 79: GPU has fallen off the bus",
        ),
        (
            [GPUEvent(0, UUID0, DOUBLE_BIT_ECC_EVENT)],
            [],
            [],
            Health.DEGRADED,
            "double bit ECC error",
        ),
        ([], ["too hot (limit 87 C)"], [], Health.DEGRADED, "too hot (limit 87 C)"),
        (
            [],
            ["row remapping failed: the GPU needs service"],
            [],
            Health.FAILED,
            "row remapping failed: the GPU needs service",
        ),
        (
            [],
            [],
            ["HW Thermal Slowdown"],
            Health.DEGRADED,
            "clocks slowed: HW Thermal Slowdown",
        ),
        (
            [xid(94)],
            ["row remapping pending: reset the GPU"],
            ["HW Slowdown"],
            Health.DEGRADED,
            "XID 94: Contained ECC error",
        ),
    ],
)
def test_health_from_events_problems_and_slowdowns(events, problems, slowdowns, state, reason):
    h = health(events, problems, slowdowns)
    assert (h.state, h.reason) == (state, reason)


def test_every_finding_is_kept_worst_first_once():
    h = health([xid(94), xid(79), xid(94)], ["too hot (limit 87 C)"])
    assert h.reasons == (
        "XID 79: GPU has fallen off the bus",
        "XID 94: Contained ECC error",
        "too hot (limit 87 C)",
    )


@pytest.mark.parametrize(
    "overrides, state, reason",
    [
        ({}, Health.HEALTHY, ""),
        ({"temperature_c": 95}, Health.DEGRADED, "too hot (limit 87 C)"),
        ({"ecc_volatile_uncorrected": 2}, Health.DEGRADED, "uncorrected ECC errors over 0"),
        (
            {"remapped_rows": [3, 1, 1, 0]},
            Health.DEGRADED,
            "row remapping pending: reset the GPU",
        ),
        (
            {"remapped_rows": [3, 1, 0, 1]},
            Health.FAILED,
            "row remapping failed: the GPU needs service",
        ),
        (
            {"remapped_rows": None, "retired_pages_pending": 0, "retired_pages": {"dbe": 60}},
            Health.FAILED,
            "60 or more retired pages: the GPU needs service",
        ),
    ],
)
def test_health_of_the_problems_nvml_reports(fake, overrides, state, reason):
    """The problem texts nvml.py writes, read the way health() reads them."""
    spec = nvml_data.hgx(count=1)
    spec["gpus"][0].update(overrides)
    fake(spec)
    problems = NVML.open().problems(Checks())[0]
    h = health([], problems)
    assert (h.state, h.reason) == (state, reason)


def test_a_lost_gpu_is_failed(fake):
    spec = nvml_data.hgx(count=2)
    fake(spec)
    session = NVML.open()
    spec["gpus"][1]["lost"] = True
    fake(spec)
    h = health([], session.problems(Checks())[1])
    assert h.state is Health.FAILED
    assert h.reason.startswith("unreadable through NVML")


# ---- clock slowdowns ------------------------------------------------------------


@pytest.mark.parametrize("driver", ["550.90.07", "525.147.05"])  # the older name before R535
def test_only_harmful_clock_reasons_count(fake, driver):
    spec = nvml_data.hgx(count=3, driver_version=driver)
    spec["gpus"][0]["clocks_event_reasons"] = ["sw_power_cap", "sync_boost"]  # busy, fine
    spec["gpus"][1]["clocks_event_reasons"] = ["hw_thermal_slowdown", "sw_power_cap"]
    spec["gpus"][2]["clocks_event_reasons"] = None  # not supported
    fake(spec)
    assert NVML.open().slowdowns() == {0: [], 1: ["HW Thermal Slowdown"], 2: []}


# ---- the watcher ------------------------------------------------------------------


def raise_events(fake, spec: dict, *events: dict) -> None:
    spec.setdefault("events", []).extend(events)
    fake(spec)


def test_events_are_delivered_in_order_once(fake):
    spec = nvml_data.hgx(count=2)
    fake(spec)
    watcher = NVML.open().watch()
    uuid1 = spec["gpus"][1]["uuid"]

    raise_events(
        fake,
        spec,
        {"gpu": 1, "type": "xid", "xid": 94},
        {"gpu": uuid1, "type": "double_bit_ecc"},
        {"gpu": 1, "type": "xid", "xid": 95},
    )
    got = watcher.wait(1000)

    assert got == [
        GPUEvent(index=1, uuid=uuid1, kind="xid", xid=94),
        GPUEvent(index=1, uuid=uuid1, kind="double_bit_ecc"),
        GPUEvent(index=1, uuid=uuid1, kind="xid", xid=95),
    ]
    assert watcher.wait(10) == []  # each once
    assert health(got).reason == "XID 95: Uncontained ECC error"


def test_a_wait_with_nothing_pending_times_out_empty(fake):
    fake(nvml_data.hgx(count=1))
    watcher = NVML.open().watch()
    started = time.monotonic()
    assert watcher.wait(50) == []
    assert time.monotonic() - started >= 0.05  # it waited, rather than spinning


def test_an_event_raised_while_waiting_ends_the_wait(fake):
    spec = nvml_data.hgx(count=1)
    fake(spec)
    watcher = NVML.open().watch()
    timer = threading.Timer(0.1, raise_events, (fake, spec, {"gpu": 0, "xid": 79}))
    timer.start()
    try:
        got = watcher.wait(10_000)
    finally:
        timer.join()
    assert [(e.index, e.xid) for e in got] == [(0, 79)]


def test_events_from_before_the_watcher_are_not_replayed(fake):
    """An agent restarted after an XID does not hear it again, as with the driver."""
    spec = nvml_data.hgx(count=1)
    spec["events"] = [{"gpu": 0, "xid": 79}]
    fake(spec)
    watcher = NVML.open().watch()
    assert watcher.wait(10) == []


def test_a_gpu_without_event_support_has_no_events_and_is_no_error(fake):
    spec = nvml_data.hgx(count=3)
    spec["gpus"][1]["event_types"] = None  # NVML: Not Supported
    spec["gpus"][2]["event_types"] = ["pstate"]  # none of the critical ones
    fake(spec)
    watcher = NVML.open().watch()
    critical = pynvml.nvmlEventTypeXidCriticalError | pynvml.nvmlEventTypeDoubleBitEccError
    assert watcher.registered == {0: critical}  # the supported subset: no clock events

    raise_events(fake, spec, {"gpu": 1, "xid": 79}, {"gpu": 2, "xid": 79}, {"gpu": 0, "xid": 48})
    assert [(e.index, e.xid) for e in watcher.wait(1000)] == [(0, 48)]


def test_no_gpu_with_events_waits_and_returns_none(fake):
    spec = nvml_data.hgx(count=1)
    spec["gpus"][0]["event_types"] = None
    fake(spec)
    watcher = NVML.open().watch()
    assert watcher.registered == {}
    assert watcher.wait(20) == []


def test_a_gpu_fallen_off_the_bus_is_still_named(fake):
    """After XID 79 the GPU answers nothing; the event is matched to it by its handle."""
    spec = nvml_data.hgx(count=2)
    fake(spec)
    session = NVML.open()
    watcher = session.watch()
    spec["gpus"][1]["lost"] = True
    raise_events(fake, spec, {"gpu": 1, "xid": 79})

    got = watcher.wait(1000)
    assert got == [GPUEvent(index=1, uuid=spec["gpus"][1]["uuid"], kind="xid", xid=79)]
    h = health(got, session.problems(Checks())[1])
    assert h.state is Health.FAILED
    assert h.reason == "XID 79: GPU has fallen off the bus"


def test_close_frees_the_event_set(fake):
    fake(nvml_data.hgx(count=1))
    watcher = NVML.open().watch()
    event_set = watcher._set
    watcher.close()
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        watcher.lib.nvmlEventSetWait_v2(event_set, 0)


# ---- the double keeps to pynvml -------------------------------------------------


def test_the_doubles_wait_times_out_as_pynvml_does(fake):
    fake(nvml_data.hgx(count=1))
    lib = FakeNVML(Path(os.environ[nvml.FAKE_ENV]))
    lib.nvmlInit()
    event_set = lib.nvmlEventSetCreate()
    lib.nvmlDeviceRegisterEvents(
        lib.nvmlDeviceGetHandleByIndex(0), pynvml.nvmlEventTypeXidCriticalError, event_set
    )
    with pytest.raises(pynvml.NVMLError) as raised:
        lib.nvmlEventSetWait_v2(event_set, 0)
    # The very class pynvml raises for NVML_ERROR_TIMEOUT.
    assert type(raised.value) is type(pynvml.NVMLError(pynvml.NVML_ERROR_TIMEOUT))
    assert type(raised.value) is pynvml.NVMLError_Timeout


def test_the_doubles_event_data_has_pynvmls_fields(fake):
    spec = nvml_data.hgx(count=1)
    fake(spec)
    lib = FakeNVML(Path(os.environ[nvml.FAKE_ENV]))
    lib.nvmlInit()
    h = lib.nvmlDeviceGetHandleByIndex(0)
    event_set = lib.nvmlEventSetCreate()
    with pytest.raises(pynvml.NVMLError_NotSupported):  # all asked for, or none
        lib.nvmlDeviceRegisterEvents(h, pynvml.nvmlEventTypeClock, event_set)
    lib.nvmlDeviceRegisterEvents(h, lib.nvmlDeviceGetSupportedEventTypes(h), event_set)
    raise_events(fake, spec, {"gpu": 0, "xid": 79})

    data = lib.nvmlEventSetWait_v2(event_set, 1000)

    fields = [name for name, _type in pynvml.c_nvmlEventData_t._fields_]
    assert all(hasattr(data, f) for f in fields)
    assert (data.eventType, data.eventData) == (pynvml.nvmlEventTypeXidCriticalError, 79)
    assert data.device == h
