"""GPUs through NVML. The only module that calls pynvml.

Keeping every NVML call here keeps the test double honest: ``FakeNVML`` below
implements exactly the functions this module calls, with pynvml's signatures,
return types and exceptions. It is switched on only by ``LLMGW_FAKE_NVML=<json
file>`` (tests and demos on machines without a GPU; see docs/agent.md).

No NVIDIA driver or library is not an error: the machine is a CPU node.
"""

from __future__ import annotations

import ctypes
import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import pynvml

from agentd import protocol
from agentd.xid import CLOCK_EVENT, DOUBLE_BIT_ECC_EVENT, XID_EVENT, GPUEvent

logger = logging.getLogger(__name__)

FAKE_ENV = "LLMGW_FAKE_NVML"
PCI_DEVICES = Path("/sys/bus/pci/devices")
# NVIDIA's guidance: a board with this many retired pages is due for replacement.
RETIRED_PAGES_LIMIT = 60
# The driver's critical events the watcher asks for, where a GPU supports them.
# Clock-change events were Kepler's only: newer GPUs say why clocks are slowed
# through the clock-event reasons below, read each time instead.
WATCHED_EVENTS = {
    pynvml.nvmlEventTypeXidCriticalError: XID_EVENT,
    pynvml.nvmlEventTypeDoubleBitEccError: DOUBLE_BIT_ECC_EVENT,
    pynvml.nvmlEventTypeClock: CLOCK_EVENT,
}
# Clock-event reasons that mean the GPU is slowing itself to survive, in
# nvidia-smi's words. Idle, power capping, sync boost and application clocks
# are normal operation.
HARMFUL_CLOCK_REASONS = {
    pynvml.nvmlClocksEventReasonHwSlowdown: "HW Slowdown",
    pynvml.nvmlClocksEventReasonHwThermalSlowdown: "HW Thermal Slowdown",
    pynvml.nvmlClocksEventReasonSwThermalSlowdown: "SW Thermal Slowdown",
    pynvml.nvmlClocksEventReasonHwPowerBrakeSlowdown: "HW Power Brake Slowdown",
}


def normalise_bus_id(bus_id: str) -> str:
    """One spelling of a PCI address: NVML says 00000000:18:00.0, sysfs 0000:18:00.0."""
    domain, _, rest = bus_id.strip().lower().rpartition(":")
    dom, _, bus = domain.partition(":") if domain.count(":") else ("0", "", domain)
    try:
        return f"{int(dom, 16):04x}:{bus}:{rest}"
    except ValueError:
        return bus_id.strip().lower()


def cuda_version_text(value: int) -> str:
    """nvmlSystemGetCudaDriverVersion's 12040 is CUDA 12.4."""
    return f"{value // 1000}.{(value % 1000) // 10}"


@dataclass
class Checks:
    ecc_error_threshold: int = 0
    max_temperature_c: int = 87


@dataclass
class _Device:
    index: int
    handle: object
    pci_bus_id: str = ""
    slowdown_c: int | None = None
    extra: dict = field(default_factory=dict)


class NVML:
    """An open NVML session for the agent's lifetime. ``open()`` is None on a CPU node."""

    def __init__(self, lib, devices: list[_Device], driver: str, cuda: str, pci_root: Path):
        self.lib = lib
        self.devices = devices
        self.driver_version = driver
        self.cuda_version = cuda
        self.pci_root = pci_root

    @classmethod
    def open(cls, pci_root: Path = PCI_DEVICES) -> NVML | None:
        lib = _library()
        try:
            lib.nvmlInit()
        except pynvml.NVMLError as exc:
            logger.info("no NVIDIA driver (NVML: %s): a CPU node", exc)
            return None
        try:
            driver = lib.nvmlSystemGetDriverVersion()
            try:
                cuda = cuda_version_text(lib.nvmlSystemGetCudaDriverVersion())
            except pynvml.NVMLError:
                cuda = ""
            devices = [_open_device(lib, i) for i in range(lib.nvmlDeviceGetCount())]
        except pynvml.NVMLError as exc:
            # A driver that loads but cannot list its GPUs is a node to look at,
            # not one to place on: report it as having none.
            logger.warning("NVML loaded but listing GPUs failed: %s; reporting no GPUs", exc)
            _try(None, lib.nvmlShutdown)
            return None
        return cls(lib, devices, driver, cuda, pci_root)

    def close(self) -> None:
        _try(None, self.lib.nvmlShutdown)

    # ---- registration ------------------------------------------------------

    def gpus(self, checks: Checks) -> list[protocol.GPU]:
        """Every GPU with its facts and current problems."""
        peers = self._nvlink_peers()
        out = []
        for d in self.devices:
            lib, h = self.lib, d.handle
            try:
                if h is None:
                    raise pynvml.NVMLError(pynvml.NVML_ERROR_UNKNOWN)
                mem = lib.nvmlDeviceGetMemoryInfo(h)
                major, minor = _try((0, 0), lib.nvmlDeviceGetCudaComputeCapability, h)
                gpu = protocol.GPU(
                    index=d.index,
                    uuid=lib.nvmlDeviceGetUUID(h),
                    name=lib.nvmlDeviceGetName(h),
                    memory_total_mb=mem.total // 2**20,
                    memory_used_mb=mem.used // 2**20,
                    compute_capability=f"{major}.{minor}" if major else "",
                    numa_node=self._numa_node(d),
                    pci_bus_id=d.pci_bus_id,
                    driver_version=self.driver_version,
                    cuda_version=self.cuda_version,
                    nvlink_peers=sorted(peers.get(d.index, ())),
                    ecc_errors=self._ecc_errors(h),
                    temperature_c=self._temperature(h),
                    problems=self._problems(d, checks),
                )
            except pynvml.NVMLError as exc:
                # Seen but unreadable (fallen off the bus, say): reported with the
                # problem so placement stays away, rather than silently dropped.
                gpu = protocol.GPU(
                    index=d.index,
                    uuid=_uuid_or_placeholder(lib, d),
                    pci_bus_id=d.pci_bus_id,
                    driver_version=self.driver_version,
                    cuda_version=self.cuda_version,
                    problems=[f"unreadable through NVML: {d.extra.get('error') or exc}"],
                )
            out.append(gpu)
        return out

    def _numa_node(self, d: _Device) -> int | None:
        try:
            node = self.lib.nvmlDeviceGetNumaNodeId(d.handle)
        except pynvml.NVMLError:
            # Older drivers lack the call; the kernel knows the same thing.
            try:
                text = (self.pci_root / normalise_bus_id(d.pci_bus_id) / "numa_node").read_text()
                node = int(text.strip())
            except (OSError, ValueError):
                return None
        return node if node >= 0 else None

    def _temperature(self, h) -> int | None:
        return _try(None, self.lib.nvmlDeviceGetTemperature, h, pynvml.NVML_TEMPERATURE_GPU)

    def _ecc_errors(self, h) -> int:
        # No ECC on this board (consumer cards): nothing counted.
        return _try(
            0,
            self.lib.nvmlDeviceGetTotalEccErrors,
            h,
            pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
            pynvml.NVML_VOLATILE_ECC,
        )

    def _nvlink_peers(self) -> dict[int, set[int]]:
        """NVLink peers by GPU index, from the PCI address at the far end of each link.

        On NVSwitch systems (HGX) every link ends at a switch, not a GPU; all GPUs
        on the switches reach each other at full bandwidth, so they are all peers.
        """
        by_bus = {normalise_bus_id(d.pci_bus_id): d.index for d in self.devices if d.pci_bus_id}
        peers: dict[int, set[int]] = {}
        on_switch: set[int] = set()
        for d in self.devices:
            if d.handle is None:
                continue
            try:
                switched, direct = self._links(d.handle, by_bus)
            except pynvml.NVMLError as exc:
                logger.warning("GPU %d: reading NVLinks failed: %s", d.index, exc)
                continue
            if switched:
                on_switch.add(d.index)
            if direct - {d.index}:
                peers[d.index] = direct - {d.index}
        for i in on_switch:
            peers.setdefault(i, set()).update(on_switch - {i})
        return peers

    def _links(self, h, by_bus: dict[str, int]) -> tuple[bool, set[int]]:
        """(whether any link ends at an NVSwitch, the GPU indices at the end of the others)."""
        lib = self.lib
        switched, direct = False, set()
        for link in range(pynvml.NVML_NVLINK_MAX_LINKS):
            try:
                active = lib.nvmlDeviceGetNvLinkState(h, link)
            except (pynvml.NVMLError_NotSupported, pynvml.NVMLError_InvalidArgument):
                break  # no NVLink on this GPU, or past its last link
            if active != pynvml.NVML_FEATURE_ENABLED:
                continue
            kind = _try(
                pynvml.NVML_NVLINK_DEVICE_TYPE_GPU,
                lib.nvmlDeviceGetNvLinkRemoteDeviceType,
                h,
                link,
            )
            if kind == pynvml.NVML_NVLINK_DEVICE_TYPE_SWITCH:
                switched = True
                continue
            remote = lib.nvmlDeviceGetNvLinkRemotePciInfo(h, link).busId
            other = by_bus.get(normalise_bus_id(remote))
            if other is not None:
                direct.add(other)
        return switched, direct

    # ---- heartbeats --------------------------------------------------------

    def memory_used_mb(self) -> list[int]:
        """Per GPU in index order; a GPU that cannot be read counts as full."""
        out = []
        for d in self.devices:
            if d.handle is None:
                out.append(0)
                continue
            try:
                out.append(self.lib.nvmlDeviceGetMemoryInfo(d.handle).used // 2**20)
            except pynvml.NVMLError:
                out.append(0)
        return out

    def process_memory(self) -> dict[int, dict[str, int]]:
        """GPU memory by process, as the driver lists compute processes: pid -> {uuid: bytes}.

        The pids are the driver's, from the host's PID namespace: an agent in a
        container without it finds none of its engines here, and its shards show
        no figure rather than a wrong one. A process whose use the driver cannot
        say (None) is left out.
        """
        out: dict[int, dict[str, int]] = {}
        for d in self.devices:
            if d.handle is None:
                continue
            try:
                uuid = d.extra.get("uuid") or self.lib.nvmlDeviceGetUUID(d.handle)
                d.extra["uuid"] = uuid
                procs = self.lib.nvmlDeviceGetComputeRunningProcesses(d.handle)
            except pynvml.NVMLError:
                continue
            for proc in procs:
                if proc.usedGpuMemory is None:
                    continue
                per = out.setdefault(int(proc.pid), {})
                per[uuid] = per.get(uuid, 0) + int(proc.usedGpuMemory)
        return out

    def problems(self, checks: Checks) -> dict[int, list[str]]:
        """Current problems by GPU index. The texts are stable, so a repeat is not news."""
        return {d.index: self._problems(d, checks) for d in self.devices}

    def _problems(self, d: _Device, checks: Checks) -> list[str]:
        h = d.handle
        if h is None:
            return [f"unreadable through NVML: {d.extra.get('error', 'no handle')}"]
        found = []
        try:
            ecc = self._ecc_errors(h)
            if ecc > checks.ecc_error_threshold:
                found.append(f"uncorrected ECC errors over {checks.ecc_error_threshold}")
            found += self._memory_retirement(h)
            temp = self._temperature(h)
            limit = checks.max_temperature_c
            if d.slowdown_c:
                limit = min(limit, d.slowdown_c)
            if temp is not None and temp >= limit:
                found.append(f"too hot (limit {limit} C)")
        except pynvml.NVMLError as exc:
            found.append(f"unreadable through NVML: {exc}")
        return found

    def slowdowns(self) -> dict[int, list[str]]:
        """Harmful clock-event reasons now in force, by GPU index ("HW Thermal Slowdown")."""
        return {d.index: self._slowdowns(d) for d in self.devices}

    def _slowdowns(self, d: _Device) -> list[str]:
        if d.handle is None:
            return []
        try:
            try:
                reasons = self.lib.nvmlDeviceGetCurrentClocksEventReasons(d.handle)
            except pynvml.NVMLError_FunctionNotFound:
                # Drivers before R535 have the same bits under the older name.
                reasons = self.lib.nvmlDeviceGetCurrentClocksThrottleReasons(d.handle)
        except pynvml.NVMLError:
            return []  # not supported here; a GPU that cannot be read is a problem already
        return [text for bit, text in HARMFUL_CLOCK_REASONS.items() if reasons & bit]

    # ---- events --------------------------------------------------------------

    def watch(self) -> EventWatcher:
        """An event set with every GPU registered for the critical events it supports."""
        return EventWatcher(self.lib, self.devices)

    def _memory_retirement(self, h) -> list[str]:
        lib = self.lib
        try:
            # Ampere and newer remap rows instead of retiring pages.
            _corr, _unc, pending, failed = lib.nvmlDeviceGetRemappedRows(h)
        except pynvml.NVMLError_NotSupported:
            pass
        else:
            out = []
            if pending:
                out.append("row remapping pending: reset the GPU")
            if failed:
                out.append("row remapping failed: the GPU needs service")
            return out
        out = []
        if _try(0, lib.nvmlDeviceGetRetiredPagesPendingStatus, h):
            out.append("retired pages pending: reset the GPU")
        retired = sum(
            len(_try([], lib.nvmlDeviceGetRetiredPages, h, cause))
            for cause in (
                pynvml.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS,
                pynvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR,
            )
        )
        if retired >= RETIRED_PAGES_LIMIT:
            out.append(f"{RETIRED_PAGES_LIMIT} or more retired pages: the GPU needs service")
        return out


class EventWatcher:
    """The driver's critical events (XIDs, double bit ECC errors) for the GPUs that have them.

    A GPU whose driver does not support events, or not these, is not an error:
    it just has no events (``registered`` lacks it). The event set lives until
    ``close()``; it hears what happens after it was made, not before.
    """

    MAX_PER_WAIT = 64

    def __init__(self, lib, devices: list[_Device]):
        self.lib = lib
        self.registered: dict[int, int] = {}  # GPU index -> the event types registered
        self._gpus: dict[object, tuple[int, str]] = {}  # handle -> (index, uuid)
        self._set = None
        try:
            self._set = lib.nvmlEventSetCreate()
        except pynvml.NVMLError as exc:
            logger.info("NVML events are not available (%s): no GPU has events", exc)
            return
        for d in devices:
            if d.handle is None:
                continue
            mask = self._register(d)
            if mask:
                self.registered[d.index] = mask
                uuid = d.extra.get("uuid") or _uuid_or_placeholder(lib, d)
                self._gpus[_handle_key(d.handle)] = (d.index, uuid)

    def _register(self, d: _Device) -> int:
        wanted = 0
        for bit in WATCHED_EVENTS:
            wanted |= bit
        try:
            # Only what the GPU supports: the driver refuses a mask with one type it lacks.
            mask = self.lib.nvmlDeviceGetSupportedEventTypes(d.handle) & wanted
            if mask:
                self.lib.nvmlDeviceRegisterEvents(d.handle, mask, self._set)
        except pynvml.NVMLError_NotSupported:
            mask = 0
        except pynvml.NVMLError as exc:
            logger.warning("GPU %d: registering for NVML events failed: %s", d.index, exc)
            return 0
        if not mask:
            logger.info("GPU %d: no critical events through NVML", d.index)
        return mask

    def wait(self, timeout_ms: int) -> list[GPUEvent]:
        """Wait up to ``timeout_ms`` for an event, then take what else is already pending;
        oldest first, each once. [] when none came.

        An NVML error other than the timeout (GPU is lost, say) is raised, unless
        events came before it: those are returned, and the next wait meets it again.
        """
        if self._set is None or not self.registered:
            time.sleep(timeout_ms / 1000)
            return []
        out: list[GPUEvent] = []
        wait_ms = timeout_ms
        while len(out) < self.MAX_PER_WAIT:
            try:
                data = self.lib.nvmlEventSetWait_v2(self._set, wait_ms)
            except pynvml.NVMLError_Timeout:
                break
            except pynvml.NVMLError:
                if out:
                    break
                raise
            out.append(self._event(data))
            wait_ms = 0
        return out

    def _event(self, data) -> GPUEvent:
        # By handle, not by asking NVML: after an XID 79 the GPU answers nothing.
        index, uuid = self._gpus.get(_handle_key(data.device), (None, ""))
        kind = WATCHED_EVENTS.get(data.eventType, f"0x{data.eventType:x}")
        xid = int(data.eventData) if kind == XID_EVENT else None
        return GPUEvent(index=index, uuid=uuid, kind=kind, xid=xid)

    def close(self) -> None:
        if self._set is not None:
            try:
                self.lib.nvmlEventSetFree(self._set)
            except pynvml.NVMLError as exc:
                logger.warning("freeing the NVML event set failed: %s", exc)
            self._set = None


def _handle_key(handle):
    """A GPU's handle as a key. pynvml gives ctypes pointers, which compare by identity,
    not address: the event's handle is a new object for the same GPU."""
    try:
        return ctypes.cast(handle, ctypes.c_void_p).value
    except ctypes.ArgumentError:
        return handle  # the test double's handles compare by index


def _open_device(lib, i: int) -> _Device:
    try:
        handle = lib.nvmlDeviceGetHandleByIndex(i)
    except pynvml.NVMLError as exc:
        logger.warning("GPU %d cannot be opened through NVML: %s", i, exc)
        return _Device(index=i, handle=None, extra={"error": str(exc)})
    dev = _Device(index=i, handle=handle)
    try:
        dev.pci_bus_id = lib.nvmlDeviceGetPciInfo(handle).busId
    except pynvml.NVMLError:
        pass
    try:
        dev.slowdown_c = lib.nvmlDeviceGetTemperatureThreshold(
            handle, pynvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN
        )
    except pynvml.NVMLError:
        pass
    return dev


def _try(default, fn, *args):
    """An optional NVML fact: a GPU or driver that does not support it gives the default."""
    try:
        return fn(*args)
    except pynvml.NVMLError as exc:
        if isinstance(exc, pynvml.NVMLError_GpuIsLost):
            raise
        return default


def _uuid_or_placeholder(lib, d: _Device) -> str:
    if d.handle is not None:
        try:
            return lib.nvmlDeviceGetUUID(d.handle)
        except pynvml.NVMLError:
            pass
    return f"unknown-gpu-{d.index}"


def _library():
    path = os.environ.get(FAKE_ENV)
    if path:
        from agentd.nvml_double import FakeNVML

        return FakeNVML(Path(path))
    return pynvml
