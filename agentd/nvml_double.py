"""A test double of the pynvml functions agentd/nvml.py calls, for machines without a GPU.

Used only when ``LLMGW_FAKE_NVML`` names a JSON file. Each function has
pynvml's name and arguments, returns what pynvml returns (its own ctypes
structs where pynvml returns one) and fails the way pynvml fails: by raising
``pynvml.NVMLError(code)``, which pynvml maps to its ``NVMLError_*`` subclass.
A fact the file leaves out (or sets to null) raises NVMLError_NotSupported,
as a real board without that feature does.

The file is read again whenever it changes, so a test can make a GPU run hot
or lose memory rows under a running agent. Its shape::

    {"library": "present",            # "missing": nvmlInit fails as with no driver
     "driver_version": "550.90.07",
     "cuda_driver_version": 12040,
     "gpus": [{"uuid": "GPU-...", "name": "NVIDIA H100 80GB HBM3",
               "memory_total_bytes": 85520809984, "memory_used_bytes": 0,
               "compute_capability": [9, 0], "numa_node": 0,
               "pci_bus_id": "00000000:18:00.0",
               "temperature_c": 34, "slowdown_c": 90,
               "ecc_volatile_uncorrected": 0,
               "remapped_rows": [0, 0, 0, 0],       # corrected, uncorrected, pending, failed
               "retired_pages_pending": null, "retired_pages": null,
               "nvlinks": [{"active": true, "remote_type": "switch",
                            "remote_pci_bus_id": "00000000:05:00.0"}],
               "event_types": ["single_bit_ecc", "double_bit_ecc", "pstate", "xid"],
               "clocks_event_reasons": ["gpu_idle"],  # or "hw_thermal_slowdown", ...
               "lost": false}],                     # true: every call says GPU is lost
     "processes": [{"pid": 4242, "gpu": 0, "used_bytes": 13314398208}],
     "events": [{"gpu": 0, "type": "xid", "xid": 79}]}  # gpu: an index or a UUID

Events are a log the test appends to, as the driver raises them: an event set
(``nvmlEventSetCreate``) hears those appended after it was made, each once, in
order, and only for a GPU and type registered in it; ``nvmlEventSetWait_v2``
waits for one up to its timeout, reading the file again as it waits, and raises
NVMLError_Timeout when none came, as the driver does.

Processes hold GPU memory as a driver lists them: ``processes`` in the file
(someone else's job, say), and claims that running programs write as
``<file>.processes/<pid>.json`` (``{"GPU-uuid": bytes}``; ``agentd.gpuclaims``).
A claim counts while its process lives, as the driver frees a process's memory
when it exits; each GPU's memory used is ``memory_used_bytes`` plus what its
processes hold.

The fake engine claims through ``agentd.gpuclaims.take()``, which refuses, as
CUDA does, memory the GPU does not have free (that module says how).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pynvml

from agentd.gpuclaims import held_on

_REMOTE_TYPES = {
    "gpu": pynvml.NVML_NVLINK_DEVICE_TYPE_GPU,
    "switch": pynvml.NVML_NVLINK_DEVICE_TYPE_SWITCH,
    "ibmnpu": pynvml.NVML_NVLINK_DEVICE_TYPE_IBMNPU,
}
_EVENT_TYPES = {
    "single_bit_ecc": pynvml.nvmlEventTypeSingleBitEccError,
    "double_bit_ecc": pynvml.nvmlEventTypeDoubleBitEccError,
    "pstate": pynvml.nvmlEventTypePState,
    "xid": pynvml.nvmlEventTypeXidCriticalError,
    "clock": pynvml.nvmlEventTypeClock,
}
_CLOCK_REASONS = {
    "gpu_idle": pynvml.nvmlClocksEventReasonGpuIdle,
    "applications_clocks_setting": pynvml.nvmlClocksEventReasonApplicationsClocksSetting,
    "sw_power_cap": pynvml.nvmlClocksEventReasonSwPowerCap,
    "hw_slowdown": pynvml.nvmlClocksEventReasonHwSlowdown,
    "sync_boost": pynvml.nvmlClocksEventReasonSyncBoost,
    "sw_thermal_slowdown": pynvml.nvmlClocksEventReasonSwThermalSlowdown,
    "hw_thermal_slowdown": pynvml.nvmlClocksEventReasonHwThermalSlowdown,
    "hw_power_brake_slowdown": pynvml.nvmlClocksEventReasonHwPowerBrakeSlowdown,
    "display_clock_setting": pynvml.nvmlClocksEventReasonDisplayClockSetting,
}
# The driver branch that renamed clock "throttle" reasons to clock "event" reasons.
_EVENT_REASONS_SINCE = 535
# How often a waiting nvmlEventSetWait_v2 looks at the file again. The driver's wait
# blocks and costs nothing; at 20 ms the double's cost 0.57 % of a core on an idle
# 8-GPU node, eleven times the agent's own (bench/agent_overhead.py).
_EVENT_POLL_S = 0.1


def _fail(code: int):
    raise pynvml.NVMLError(code)


class _Handle:
    """What nvmlDeviceGetHandleByIndex returns: opaque to the caller. The driver gives one
    handle per GPU, so two for the same GPU are equal (an event names its GPU by it)."""

    def __init__(self, index: int):
        self.index = index

    def __eq__(self, other):
        return isinstance(other, _Handle) and other.index == self.index

    def __hash__(self):
        return hash(("GPU", self.index))


class _EventSet:
    """What nvmlEventSetCreate returns: the registrations, and how far into the file's
    events it has heard."""

    def __init__(self, heard: int):
        self.registered: dict[int, int] = {}  # GPU index -> event types
        self.heard = heard
        self.freed = False


class _EventData:
    """nvmlEventSetWait_v2's c_nvmlEventData_t, field for field, with the double's handle."""

    def __init__(self, device: _Handle, eventType: int, eventData: int):
        self.device = device
        self.eventType = eventType
        self.eventData = eventData
        # Not a MIG instance: NVML's "invalid" id for both.
        self.gpuInstanceId = 0xFFFFFFFF
        self.computeInstanceId = 0xFFFFFFFF


class FakeNVML:
    def __init__(self, path: Path):
        self.path = Path(path)
        self._stamp: int | None = None
        self._spec: dict = {}
        self._initialised = 0

    # ---- the file ------------------------------------------------------------

    @property
    def spec(self) -> dict:
        stamp = self.path.stat().st_mtime_ns
        if stamp != self._stamp:
            self._spec = json.loads(self.path.read_text())
            self._stamp = stamp
        return self._spec

    def _need_init(self) -> None:
        if not self._initialised:
            _fail(pynvml.NVML_ERROR_UNINITIALIZED)

    def _gpu(self, handle) -> dict:
        self._need_init()
        if not isinstance(handle, _Handle):
            _fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        gpus = self.spec.get("gpus", [])
        if handle.index >= len(gpus):
            _fail(pynvml.NVML_ERROR_GPU_IS_LOST)  # it was there when the handle was taken
        gpu = gpus[handle.index]
        if gpu.get("lost"):
            _fail(pynvml.NVML_ERROR_GPU_IS_LOST)
        return gpu

    def _processes(self, gpu: dict) -> list[tuple[int, int]]:
        """(pid, bytes) of every process holding memory on this GPU."""
        return held_on(self.path, self.spec, self.spec["gpus"].index(gpu))

    def _fact(self, handle, key: str):
        value = self._gpu(handle).get(key)
        if value is None:
            _fail(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return value

    def _link(self, handle, link: int) -> dict:
        links = self._fact(handle, "nvlinks")
        if not 0 <= link < len(links):
            _fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return links[link]

    # ---- system ----------------------------------------------------------------

    def nvmlInit(self):
        if self.spec.get("library", "present") == "missing":
            _fail(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)
        if self.spec.get("library") == "driver_not_loaded":
            _fail(pynvml.NVML_ERROR_DRIVER_NOT_LOADED)
        self._initialised += 1

    def nvmlShutdown(self):
        self._need_init()
        self._initialised -= 1

    def nvmlSystemGetDriverVersion(self):
        self._need_init()
        return self.spec["driver_version"]

    def nvmlSystemGetCudaDriverVersion(self):
        self._need_init()
        value = self.spec.get("cuda_driver_version")
        if value is None:
            _fail(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return value

    def nvmlDeviceGetCount(self):
        self._need_init()
        return len(self.spec.get("gpus", []))

    def nvmlDeviceGetHandleByIndex(self, index):
        self._need_init()
        if not 0 <= index < len(self.spec.get("gpus", [])):
            _fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        if self.spec["gpus"][index].get("lost"):
            _fail(pynvml.NVML_ERROR_GPU_IS_LOST)
        return _Handle(index)

    # ---- devices ---------------------------------------------------------------

    def nvmlDeviceGetUUID(self, handle):
        return self._fact(handle, "uuid")

    def nvmlDeviceGetName(self, handle):
        return self._fact(handle, "name")

    def nvmlDeviceGetMemoryInfo(self, handle, version=None):
        gpu = self._gpu(handle)
        mem = pynvml.c_nvmlMemory_t()
        mem.total = gpu["memory_total_bytes"]
        held = sum(used for _pid, used in self._processes(gpu))
        mem.used = min(mem.total, gpu.get("memory_used_bytes", 0) + held)
        mem.free = mem.total - mem.used
        return mem

    def nvmlDeviceGetComputeRunningProcesses(self, handle):
        return [
            pynvml.nvmlStructToFriendlyObject(
                pynvml.c_nvmlProcessInfo_v3_t(pid=pid, usedGpuMemory=used)
            )
            for pid, used in self._processes(self._gpu(handle))
        ]

    def nvmlDeviceGetCudaComputeCapability(self, handle):
        major, minor = self._fact(handle, "compute_capability")
        return (major, minor)

    def nvmlDeviceGetNumaNodeId(self, handle):
        return self._fact(handle, "numa_node")

    def nvmlDeviceGetPciInfo(self, handle):
        info = pynvml.nvmlPciInfo_t()
        bus_id = self._fact(handle, "pci_bus_id")
        info.busId = bus_id.encode()
        info.busIdLegacy = bus_id[-12:].encode()
        return info

    def nvmlDeviceGetTemperature(self, handle, sensor):
        if sensor != pynvml.NVML_TEMPERATURE_GPU:
            _fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return self._fact(handle, "temperature_c")

    def nvmlDeviceGetTemperatureThreshold(self, handle, threshold):
        if threshold != pynvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN:
            _fail(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return self._fact(handle, "slowdown_c")

    def nvmlDeviceGetTotalEccErrors(self, handle, errorType, counterType):
        if (errorType, counterType) != (
            pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
            pynvml.NVML_VOLATILE_ECC,
        ):
            _fail(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return self._fact(handle, "ecc_volatile_uncorrected")

    def nvmlDeviceGetRemappedRows(self, device):
        return tuple(self._fact(device, "remapped_rows"))

    def nvmlDeviceGetRetiredPagesPendingStatus(self, device):
        return int(self._fact(device, "retired_pages_pending"))

    def nvmlDeviceGetRetiredPages(self, device, sourceFilter):
        pages = self._fact(device, "retired_pages")
        key = (
            "sbe"
            if sourceFilter == pynvml.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS
            else "dbe"
        )
        # Page addresses; only their number matters to the agent.
        return [0x1000 * (i + 1) for i in range(pages.get(key, 0))]

    def nvmlDeviceGetNvLinkState(self, device, link):
        return pynvml.NVML_FEATURE_ENABLED if self._link(device, link).get("active") else 0

    def nvmlDeviceGetNvLinkRemoteDeviceType(self, handle, link):
        return _REMOTE_TYPES[self._link(handle, link).get("remote_type", "gpu")]

    def nvmlDeviceGetNvLinkRemotePciInfo(self, device, link):
        spec = self._link(device, link)
        if not spec.get("active"):
            _fail(pynvml.NVML_ERROR_NOT_SUPPORTED)
        info = pynvml.nvmlPciInfo_t()
        info.busId = spec["remote_pci_bus_id"].encode()
        return info

    # ---- clocks ----------------------------------------------------------------

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle):
        if _driver_branch(self.spec) < _EVENT_REASONS_SINCE:
            _fail(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
        return self._clock_reasons(handle)

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle):
        return self._clock_reasons(handle)

    def _clock_reasons(self, handle) -> int:
        mask = 0
        for name in self._fact(handle, "clocks_event_reasons"):
            mask |= _CLOCK_REASONS[name]
        return mask

    # ---- events ----------------------------------------------------------------

    def _supported_events(self, handle) -> int:
        mask = 0
        for name in self._fact(handle, "event_types"):
            mask |= _EVENT_TYPES[name]
        return mask

    def nvmlDeviceGetSupportedEventTypes(self, handle):
        return self._supported_events(handle)

    def nvmlEventSetCreate(self):
        self._need_init()
        return _EventSet(heard=len(self.spec.get("events", [])))

    def nvmlDeviceRegisterEvents(self, handle, eventTypes, eventSet):
        supported = self._supported_events(handle)
        if eventTypes & ~supported:
            _fail(pynvml.NVML_ERROR_NOT_SUPPORTED)  # as the driver: all asked for, or none
        event_set = self._event_set(eventSet)
        event_set.registered[handle.index] = event_set.registered.get(handle.index, 0) | eventTypes

    def nvmlEventSetWait_v2(self, eventSet, timeoutms):
        event_set = self._event_set(eventSet)
        deadline = time.monotonic() + timeoutms / 1000
        while True:
            data = self._next_event(event_set)
            if data is not None:
                return data
            left = deadline - time.monotonic()
            if left <= 0:
                _fail(pynvml.NVML_ERROR_TIMEOUT)
            time.sleep(min(left, _EVENT_POLL_S))

    def nvmlEventSetFree(self, eventSet):
        self._event_set(eventSet).freed = True

    def _event_set(self, eventSet) -> _EventSet:
        self._need_init()
        if not isinstance(eventSet, _EventSet) or eventSet.freed:
            _fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return eventSet

    def _next_event(self, event_set: _EventSet) -> _EventData | None:
        """The next event the set has not heard that it is registered for; the ones it is
        not registered for pass it by, as the driver never tells it of them."""
        events = self.spec.get("events", [])
        gpus = self.spec.get("gpus", [])
        while event_set.heard < len(events):
            event = events[event_set.heard]
            event_set.heard += 1
            gpu = event["gpu"]
            if isinstance(gpu, str):
                gpu = next((i for i, g in enumerate(gpus) if g.get("uuid") == gpu), None)
            kind = _EVENT_TYPES[event.get("type", "xid")]
            if gpu is None or not event_set.registered.get(gpu, 0) & kind:
                continue
            data = event.get("xid", 0) if kind == pynvml.nvmlEventTypeXidCriticalError else 0
            return _EventData(_Handle(gpu), kind, data)
        return None


def _driver_branch(spec: dict) -> int:
    try:
        return int(str(spec.get("driver_version", "")).split(".")[0])
    except ValueError:
        return 0
