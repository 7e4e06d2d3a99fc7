"""The agent's GPU watch: the NVML double's events and slowdowns reaching the outbox as
``gpu_events``, at once, bounded in a burst, said again after a registration; and the
outbox keeping every event while the socket is down."""

import asyncio
import os
import threading
import time
from pathlib import Path

import pynvml
import pytest

from agentd import nvml, protocol
from agentd.gpuwatch import MIN_GAP_S, GPUWatch
from agentd.nvml import NVML
from agentd.outbox import MAX_EVENTS, Outbox
from tests.agent import nvml_data
from tests.agent.test_agent_messages import make_agent


@pytest.fixture
def fake(tmp_path, monkeypatch):
    """Point agentd/nvml.py at a spec file; returns a function that (re)writes it whole,
    with a fresh mtime, so a waiting watcher never reads half of it."""
    path = tmp_path / "nvml.json"
    stamp = [time.time_ns()]

    def use(spec: dict) -> Path:
        tmp = nvml_data.write(tmp_path / "nvml.json.tmp", spec)
        stamp[0] += 1_000_000
        os.utime(tmp, ns=(stamp[0], stamp[0]))
        tmp.replace(path)
        return path

    monkeypatch.setenv(nvml.FAKE_ENV, str(path))
    return use


def raise_events(fake, spec: dict, *events: dict) -> None:
    spec.setdefault("events", []).extend(events)
    fake(spec)


class Sent:
    """What the watch hands to ``send``, from its thread."""

    def __init__(self):
        self.messages: list[protocol.GPUEvents] = []
        self.at: list[float] = []
        self._lock = threading.Lock()

    def __call__(self, msg):
        with self._lock:
            self.messages.append(msg)
            self.at.append(time.monotonic())

    def events(self) -> list[tuple[int, str, int | None]]:
        with self._lock:
            return [(e.gpu_index, e.kind, e.xid) for m in self.messages for e in m.events]

    def slowdowns(self) -> list[dict[int, list[str]]]:
        with self._lock:
            told = [m.slowdowns for m in self.messages if m.slowdowns]
        return [{s.gpu_index: s.reasons for s in said} for said in told]


def wait_for(check, timeout=5.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := check():
            return value
        time.sleep(0.01)
    raise AssertionError(f"timed out waiting for {check}")


@pytest.fixture
def watch(fake):
    """A started GPU watch over a two-GPU node, slowdowns read every 50 ms."""
    spec = nvml_data.hgx(count=2)
    fake(spec)
    sent = Sent()
    w = GPUWatch(NVML.open(), sent, poll_s=0.05)
    w.start()
    yield w, spec, sent
    w.close()


# ---- events ---------------------------------------------------------------------


def test_an_xid_reaches_send_at_once_as_gpu_events(fake, watch):
    w, spec, sent = watch
    # when: the driver raises XID 79 on GPU 1 and a double-bit ECC error on GPU 0
    raised = time.monotonic()
    raise_events(fake, spec, {"gpu": 1, "xid": 79}, {"gpu": 0, "type": "double_bit_ecc"})
    # then: both arrive, well before any heartbeat would have carried them
    wait_for(lambda: len(sent.events()) == 2)
    assert sent.events() == [(1, "xid", 79), (0, "double_bit_ecc", None)]
    first = next(t for m, t in zip(sent.messages, sent.at, strict=True) if m.events)
    assert first - raised < 1.0
    msg = next(m for m in sent.messages if m.events)
    assert protocol.parse_agent_message(protocol.dump(msg)) == msg  # the wire's schema


def test_events_are_logged_with_the_xids_meaning(fake, watch, caplog):
    _w, spec, sent = watch
    caplog.set_level("INFO", logger="agentd.gpuwatch")
    raise_events(fake, spec, {"gpu": 1, "xid": 79}, {"gpu": 0, "xid": 13})
    wait_for(lambda: len(sent.events()) == 2)
    text = caplog.text
    assert "GPU 1: XID 79 (GPU has fallen off the bus): fail" in text
    assert "GPU 0: XID 13 (Graphics Engine Exception): watch" in text


def test_a_burst_is_bounded_and_loses_nothing(fake, watch):
    """An engine looping on XID 13: every event arrives, in a few messages, not one each."""
    _w, spec, sent = watch
    n = 300
    for _ in range(n // 60):
        raise_events(fake, spec, *[{"gpu": 0, "xid": 13}] * 60)
        time.sleep(0.02)
    wait_for(lambda: len(sent.events()) == n)
    with_events = [t for m, t in zip(sent.messages, sent.at, strict=True) if m.events]
    assert len(with_events) < 20
    gaps = [b - a for a, b in zip(with_events, with_events[1:], strict=False)]
    assert all(g >= MIN_GAP_S * 0.9 for g in gaps)
    assert all(len(m.events) <= MAX_EVENTS for m in sent.messages)


@pytest.mark.parametrize(
    "error",
    [
        pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST),
        ValueError("a bug, or a half-written file under the double"),
    ],
)
def test_a_failing_wait_stops_nothing(fake, watch, monkeypatch, error):
    """A wait that fails (GPU lost, or worse) is logged and tried again; the next events
    still come."""
    w, spec, sent = watch
    real_wait, calls = w.watcher.wait, []

    def failing(timeout_ms):
        calls.append(timeout_ms)
        if len(calls) <= 2:
            raise error
        return real_wait(timeout_ms)

    monkeypatch.setattr(w.watcher, "wait", failing)
    monkeypatch.setattr("agentd.gpuwatch.ERROR_BACKOFF_S", 0.01)
    raise_events(fake, spec, {"gpu": 0, "xid": 48})
    wait_for(lambda: sent.events() == [(0, "xid", 48)])
    assert w._thread.is_alive()


def test_close_stops_the_thread_and_frees_the_event_set(fake):
    fake(nvml_data.hgx(count=1))
    w = GPUWatch(NVML.open(), Sent(), poll_s=0.05)
    w.start()
    event_set = w.watcher._set
    started = time.monotonic()
    w.close()
    assert time.monotonic() - started < 2
    assert not w._thread.is_alive()
    assert event_set.freed


# ---- slowdowns ------------------------------------------------------------------


def test_only_changed_slowdowns_are_told(fake, watch):
    _w, spec, sent = watch
    time.sleep(0.2)
    assert sent.slowdowns() == []  # idle clocks: nothing harmful, nothing said

    # when: GPU 1 slows down for heat
    spec["gpus"][1]["clocks_event_reasons"] = ["hw_thermal_slowdown", "sw_power_cap"]
    fake(spec)
    wait_for(lambda: sent.slowdowns())
    assert sent.slowdowns() == [{1: ["HW Thermal Slowdown"]}]

    # still slowed: not said again
    time.sleep(0.2)
    assert len(sent.slowdowns()) == 1

    # when: it cools down; then: an empty list says the slowdown ended
    spec["gpus"][1]["clocks_event_reasons"] = ["gpu_idle"]
    fake(spec)
    wait_for(lambda: len(sent.slowdowns()) == 2)
    assert sent.slowdowns()[1] == {1: []}


def test_resend_tells_every_gpus_slowdowns(fake, watch):
    """After a registration the control plane's may be stale: every GPU's, empty or not."""
    w, spec, sent = watch
    spec["gpus"][0]["clocks_event_reasons"] = ["hw_slowdown"]
    fake(spec)
    wait_for(lambda: sent.slowdowns())
    w.resend()
    wait_for(lambda: len(sent.slowdowns()) == 2)
    assert sent.slowdowns()[1] == {0: ["HW Slowdown"], 1: []}


# ---- in the agent -----------------------------------------------------------------


def _gpu_events(agent) -> list[protocol.GPUEvents]:
    return [m for m in agent.outbox if m.type == "gpu_events"]


async def _until(check, timeout=5.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := check():
            return value
        await asyncio.sleep(0.02)
    raise AssertionError(f"timed out waiting for {check}")


async def test_the_agent_puts_an_xid_in_its_outbox(tmp_path, fake):
    # given: an agent on a two-GPU node (the NVML double), started
    spec = nvml_data.hgx(count=2)
    fake(spec)
    agent = make_agent(tmp_path)
    agent.slowdown_poll_s = 0.05
    await agent.start()
    try:
        assert agent.gpuwatch is not None
        # when: the driver raises XID 79 on GPU 1
        raise_events(fake, spec, {"gpu": 1, "xid": 79})
        # then: the outbox holds it, queued on the event loop's thread
        msg = await _until(lambda: [m for m in _gpu_events(agent) if m.events])
        assert [(e.gpu_index, e.kind, e.xid) for e in msg[0].events] == [(1, "xid", 79)]
        assert agent.outbox_ready.is_set()
    finally:
        await agent.close()
    assert agent.gpuwatch.watcher._set is None  # the event set was freed


async def test_a_registration_has_slowdowns_said_again(tmp_path, fake):
    spec = nvml_data.hgx(count=2)
    spec["gpus"][1]["clocks_event_reasons"] = ["sw_thermal_slowdown"]
    fake(spec)
    agent = make_agent(tmp_path)
    agent.slowdown_poll_s = 60  # only the first read and the resend
    await agent.start()
    try:
        await _until(lambda: _gpu_events(agent))
        key, first = agent.outbox.first()
        agent.outbox.sent(key, first)  # the first read went out
        assert _gpu_events(agent) == []
        agent.on_registered()
        msg = await _until(lambda: _gpu_events(agent))
        assert {s.gpu_index: s.reasons for s in msg[0].slowdowns} == {
            0: [],
            1: ["SW Thermal Slowdown"],
        }
    finally:
        await agent.close()


async def test_a_cpu_node_watches_nothing(tmp_path, fake):
    fake({"library": "missing"})
    agent = make_agent(tmp_path)
    await agent.start()
    try:
        assert agent.gpuwatch is None
        assert not any(t.name == "gpu-events" for t in threading.enumerate())
    finally:
        await agent.close()


async def test_heartbeats_are_not_held_up_by_a_waiting_watch(tmp_path, fake):
    """The watch waits in the driver on its own thread: a heartbeat collects as fast."""
    fake(nvml_data.hgx(count=2))
    agent = make_agent(tmp_path)
    await agent.start()
    try:
        started = time.monotonic()
        for _ in range(5):
            await asyncio.to_thread(agent.heartbeat_message, agent.shard_facts())
        assert time.monotonic() - started < 2
    finally:
        await agent.close()


# ---- the outbox keeps every event ----------------------------------------------------


def _events(*reports, slowdowns=()) -> protocol.GPUEvents:
    return protocol.GPUEvents(
        type="gpu_events",
        events=[protocol.GPUEventReport(gpu_index=i, kind="xid", xid=x) for i, x in reports],
        slowdowns=[protocol.GPUSlowdown(gpu_index=i, reasons=r) for i, r in slowdowns],
    )


def test_unsent_gpu_events_merge_into_one():
    box = Outbox()
    box.put(_events((0, 94), slowdowns=[(1, ["HW Slowdown"])]))
    box.put(_events((0, 95), slowdowns=[(1, []), (2, ["HW Thermal Slowdown"])]))
    [msg] = list(box)
    assert [(e.gpu_index, e.xid) for e in msg.events] == [(0, 94), (0, 95)]
    assert {s.gpu_index: s.reasons for s in msg.slowdowns} == {1: [], 2: ["HW Thermal Slowdown"]}
    assert box.coalesced["gpu_events"] == 1


def test_past_the_bound_the_harmless_events_go_first():
    """An XID 79 among hundreds of an engine's XID 13 survives a long disconnection."""
    box = Outbox()
    box.put(_events(*[(0, 13)] * 200))
    box.put(_events((3, 79)))
    box.put(_events(*[(0, 13)] * 200))
    [msg] = list(box)
    assert len(msg.events) == MAX_EVENTS
    assert (3, 79) in [(e.gpu_index, e.xid) for e in msg.events]


def test_a_notice_replaces_an_older_one_queued():
    box = Outbox()
    box.put(protocol.NodeNotice(type="node_notice", in_s=120, source="aws"))
    box.put(protocol.NodeNotice(type="node_notice", in_s=90, source="aws"))
    assert [m.in_s for m in box] == [90]


def test_events_are_not_merged_into_the_message_being_sent():
    """Queued while the socket writes one: sent after it, each event once."""
    box = Outbox()
    box.put(_events((0, 79)))
    key, sending = box.first()
    box.put(_events((1, 48)))  # arrives during the write
    box.put(_events((1, 94)))  # merges with the one that waits
    box.sent(key, sending)
    [waiting] = list(box)
    assert [(e.gpu_index, e.xid) for e in waiting.events] == [(1, 48), (1, 94)]
    assert [(e.gpu_index, e.xid) for e in sending.events] == [(0, 79)]
