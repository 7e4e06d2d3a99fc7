"""Nodes and what their agents report about them."""

from django.core.validators import RegexValidator
from django.db import models
from django.urls import reverse
from django.utils import timezone

from agentd.protocol import NODE_ID_PATTERN
from fleet.selectors import effective_labels

from .choices import Engine, GPUHealth, NodeState, VllmBuild

node_id_validator = RegexValidator(
    NODE_ID_PATTERN, "a node id is 1-63 letters, digits, '.', '_' or '-', starting alphanumeric"
)


class Node(models.Model):
    """A machine running agentd. Its id is the one its agent registers with.

    Operator intent (``cordoned``, ``draining``, ``operator_labels``) is kept apart
    from what the agent reports (everything else), and the agent can never change
    the former.
    """

    id = models.CharField(primary_key=True, max_length=63, validators=[node_id_validator])
    hostname = models.CharField(max_length=255, blank=True)
    mgmt_addr = models.CharField(
        "management address", max_length=255, blank=True, help_text="Address engines listen on."
    )
    mgmt_interface = models.CharField(
        "management interface",
        max_length=15,
        blank=True,
        help_text="The interface the management address is on, as the agent found it. "
        "Multi-node engines bootstrap over it. Empty: not reported.",
    )
    agent_labels = models.JSONField(
        default=dict, blank=True, help_text="Labels the agent reports (from agent.yaml)."
    )
    operator_labels = models.JSONField(
        default=dict,
        blank=True,
        help_text="Labels set by operators. They win over an agent label of the same key.",
    )
    state = models.CharField(max_length=16, choices=NodeState.choices, default=NodeState.READY)
    cordoned = models.BooleanField(default=False, help_text="No new placements on this node.")
    vllm_build = models.CharField(
        "vLLM build",
        max_length=8,
        choices=VllmBuild.choices,
        default=VllmBuild.AUTO,
        help_text="Which vLLM build this node installs. auto: CUDA 13 where the driver "
        "supports it (>= 580), else CUDA 12.9 (>= 575); the CPU build on a node without "
        "an NVIDIA GPU. The agent is told at once.",
    )
    draining = models.BooleanField(
        default=False, help_text="Replicas are being moved away; cordoned when done."
    )
    notice_deadline = models.DateTimeField(
        null=True,
        blank=True,
        help_text="When the node goes away, as its notice said (a spot reclaim, a "
        "maintenance): it drains from the notice on, replacements first.",
    )
    notice_source = models.CharField(max_length=64, blank=True)
    notice_reason = models.CharField(max_length=255, blank=True)
    connected = models.BooleanField(default=False, help_text="An agent socket is open now.")
    channel_name = models.CharField(
        max_length=128, blank=True, editable=False, help_text="The socket that holds this node."
    )
    last_seen = models.DateTimeField(null=True, blank=True)
    registered_at = models.DateTimeField(null=True, blank=True)
    inventory_digest = models.CharField(
        max_length=64,
        blank=True,
        editable=False,
        help_text="SHA-256 of the GPUs, fabrics and engine installs the last "
        "registration wrote; empty once a heartbeat changed any of them. A registration "
        "with the same digest leaves those rows as they are.",
    )
    agent_version = models.CharField(max_length=64, blank=True)
    engine_versions = models.JSONField(default=dict, blank=True)
    memory_total_mb = models.PositiveBigIntegerField(
        "memory (MB)", null=True, blank=True, help_text="MemTotal. Empty: the agent did not say."
    )
    running_shards = models.JSONField(
        default=list, blank=True, help_text="Shards the agent reported running at registration."
    )
    desired_version = models.PositiveBigIntegerField(
        default=0, help_text="Version of the desired set of shards for this node."
    )
    acked_version = models.PositiveBigIntegerField(
        default=0, help_text="The newest desired-set version the agent has applied."
    )
    desired_lag_since = models.DateTimeField(
        "behind since",
        null=True,
        blank=True,
        help_text="Since when the acknowledged version has been behind the desired one "
        "without progress. Empty: caught up.",
    )
    weights_reclaimed_bytes = models.PositiveBigIntegerField(
        "weights reclaimed (bytes)",
        default=0,
        editable=False,
        help_text="Bytes of weights the node removed when the clean-up asked, all told.",
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["id"]
        permissions = [
            # Apart from change_node: moving a fleet's workload is a bigger act
            # than editing a node's labels, and the API's actions have no form.
            ("drain_node", "Can cordon, drain and uncordon nodes"),
        ]

    def __str__(self) -> str:
        return self.id

    def get_absolute_url(self) -> str:
        """Its console page: the admin's "View on site" goes there."""
        return reverse("console:node", args=[self.pk])

    @property
    def labels(self) -> dict:
        """The labels in effect (``fleet.selectors.effective_labels``)."""
        return effective_labels(self.agent_labels, self.operator_labels)


class GPU(models.Model):
    """One GPU of a node, as NVML reports it."""

    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="gpus")
    index = models.PositiveSmallIntegerField()
    uuid = models.CharField("UUID", max_length=96)
    name = models.CharField(max_length=255, blank=True)
    memory_total_mb = models.PositiveIntegerField("memory total (MB)", default=0)
    memory_used_mb = models.PositiveIntegerField("memory used (MB)", default=0)
    compute_capability = models.CharField(max_length=16, blank=True)
    numa_node = models.IntegerField("NUMA node", null=True, blank=True)
    pci_bus_id = models.CharField("PCI bus id", max_length=32, blank=True)
    driver_version = models.CharField(max_length=32, blank=True)
    cuda_version = models.CharField("CUDA version", max_length=16, blank=True)
    nvlink_peers = models.JSONField(
        "NVLink peers", default=list, blank=True, help_text="Indices of GPUs linked by NVLink."
    )
    ecc_errors = models.PositiveIntegerField("ECC errors", default=0)
    temperature_c = models.IntegerField("temperature (°C)", null=True, blank=True)
    problems = models.JSONField(
        default=list, blank=True, help_text="Any problem keeps this GPU out of placement."
    )
    # Its health (docs/operations.md, "GPU faults and notices"): the worst of its
    # fault, its problems and its slowdowns (fleet.services.gpu_health).
    health = models.CharField(
        max_length=16,
        choices=GPUHealth.choices,
        default=GPUHealth.HEALTHY,
        help_text="Degraded: nothing new is placed on it. Failed: what runs on it is "
        "moved away too, and it stays out until an operator clears it.",
    )
    health_reason = models.CharField(max_length=255, blank=True)
    fault = models.CharField(
        max_length=16,
        choices=GPUHealth.choices,
        default=GPUHealth.HEALTHY,
        help_text="What its XIDs and ECC events left: kept until an operator clears it.",
    )
    fault_reason = models.CharField(max_length=255, blank=True)
    fault_at = models.DateTimeField(null=True, blank=True)
    slowdowns = models.JSONField(
        default=list, blank=True, help_text="Harmful clock slowdowns now, as NVML names them."
    )
    xids = models.JSONField(
        "XIDs", default=dict, blank=True, help_text="How many of each XID it reported."
    )
    drained_at = models.DateTimeField(
        null=True,
        blank=True,
        help_text="When its replicas were moved away for its failure. Empty while the "
        "mass-failure brake holds them.",
    )

    class Meta:
        ordering = ["node", "index"]
        constraints = [
            models.UniqueConstraint(fields=["node", "index"], name="gpu_unique_node_index"),
        ]
        verbose_name = "GPU"

    def __str__(self) -> str:
        return f"{self.node_id}/gpu{self.index}"

    @property
    def healthy(self) -> bool:
        """Placement may use it: no problems, and neither degraded nor failed."""
        return not self.problems and self.health == GPUHealth.HEALTHY


class FabricAttachment(models.Model):
    """A node's attachment to a high-speed fabric (InfiniBand/RoCE) through its HCAs."""

    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="fabrics")
    fabric = models.CharField(max_length=64)
    hcas = models.JSONField("HCAs", default=list, blank=True)
    rate_gbps = models.PositiveIntegerField("rate (Gbps)", default=0)

    class Meta:
        ordering = ["node", "fabric"]

    def __str__(self) -> str:
        return f"{self.node_id}:{self.fabric}"


class Storage(models.Model):
    """A filesystem the agent watches (state and weights dirs). Replaced on every heartbeat."""

    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="storage")
    path = models.CharField(max_length=1024)
    free_bytes = models.PositiveBigIntegerField()
    total_bytes = models.PositiveBigIntegerField()
    shared = models.BooleanField(default=False, help_text="On NFS, CIFS, Lustre and the like.")

    class Meta:
        ordering = ["node", "path"]
        verbose_name_plural = "storage"

    def __str__(self) -> str:
        return f"{self.node_id}:{self.path}"


class LocalWeights(models.Model):
    """Model weights present on a node: one top-level entry of one of its weights dirs.

    The agent reports what is on its disk (path, size, source, last use); the
    rows are updated in place by (node, path), so what the control plane keeps
    about an entry (the pin, since when nothing needs it, a removal under way)
    survives each new report. ``fleet.services.weights_gc`` decides what goes.
    """

    class Removal(models.TextChoices):
        NONE = "", "-"  # no removal under way
        PROPOSED = "proposed", "proposed"  # chosen by a pass; not yet on the node's socket
        SENT = "sent", "sent"  # on the node's socket; its reply is awaited

    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="weights")
    path = models.CharField(max_length=1024)
    size_bytes = models.PositiveBigIntegerField("size (bytes)")
    shared = models.BooleanField(default=False, help_text="On a filesystem other nodes share.")
    source = models.CharField(
        max_length=1024,
        blank=True,
        help_text="The profile model_path it was fetched from (https:// or hf://). "
        "Empty: it was on the disk already.",
    )
    last_used_at = models.DateTimeField(
        "last used (node)",
        null=True,
        blank=True,
        help_text="When an engine on the node last used it, by the agent. Empty: never seen.",
    )
    first_seen_at = models.DateTimeField(default=timezone.now, editable=False)
    # Control-plane state: kept across reports.
    pinned = models.BooleanField(default=False, help_text="Never removed by the clean-up.")
    unused_since = models.DateTimeField(
        null=True,
        blank=True,
        help_text="Since when no desired or running shard here needs it, as the clean-up "
        "saw. Empty: in use (or not looked at yet).",
    )
    remove_requested = models.BooleanField(
        default=False, help_text="An operator asked to remove it now (still only if unused)."
    )
    removal = models.CharField(max_length=8, choices=Removal.choices, default="", blank=True)
    removal_request_id = models.CharField(max_length=64, blank=True)
    removal_desired_version = models.PositiveBigIntegerField(default=0)
    removal_at = models.DateTimeField(null=True, blank=True)
    removal_reason = models.CharField(max_length=255, blank=True)
    kept_at = models.DateTimeField(
        null=True, blank=True, help_text="When the node last kept it although proposed."
    )
    kept_reason = models.TextField(blank=True)

    class Meta:
        ordering = ["node", "path"]
        verbose_name_plural = "local weights"
        constraints = [
            models.UniqueConstraint(fields=["node", "path"], name="weights_unique_node_path"),
        ]

    def __str__(self) -> str:
        return f"{self.node_id}:{self.path}"


class EngineInstall(models.Model):
    """The state of one engine's installation on a node, as the agent reports it."""

    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="engine_installs")
    engine = models.CharField(max_length=32)
    version = models.CharField(max_length=255, blank=True)
    variant = models.CharField(max_length=255, blank=True)
    state = models.CharField(max_length=32)
    detail = models.TextField(blank=True)
    progress_percent = models.PositiveSmallIntegerField(
        "progress (%)", null=True, blank=True, help_text="While installing, where known."
    )

    class Meta:
        ordering = ["node", "engine"]
        constraints = [
            models.UniqueConstraint(fields=["node", "engine"], name="engine_install_unique"),
        ]

    def __str__(self) -> str:
        return f"{self.node_id}:{self.engine} {self.state}"


class WantedEngine(models.Model):
    """An engine, at a version, that every node of the fleet should have installed.

    Agents install it themselves (agentd/install.py), each in the build its node's
    ``vllm_build`` and hardware call for; a change is sent to every connected node
    at once. Nodes that disable an engine, or name its binary by hand, keep theirs.
    """

    engine = models.CharField(
        max_length=32,
        unique=True,
        choices=[c for c in Engine.choices if c[0] != Engine.FAKE],
    )
    version = models.CharField(
        max_length=64,
        help_text="The release to install, e.g. 0.11.2 (pip's version: vLLM's cu129 wheel "
        "is the same version's release asset).",
        validators=[
            RegexValidator(r"^[A-Za-z0-9][A-Za-z0-9.+!_-]*$", "a version, like 0.11.2 or 0.3.36")
        ],
    )
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["engine"]

    def __str__(self) -> str:
        return f"{self.engine} {self.version}"


class NodeLoad(models.Model):
    """The latest load sample of a node, stamped when it arrived."""

    node = models.OneToOneField(Node, on_delete=models.CASCADE, related_name="load")
    sampled_at = models.DateTimeField()
    cpu_percent = models.FloatField("CPU %")
    cpu_count = models.PositiveIntegerField("CPUs")
    load1 = models.FloatField()
    load5 = models.FloatField()
    load15 = models.FloatField()
    memory_used_bytes = models.PositiveBigIntegerField()
    memory_available_bytes = models.PositiveBigIntegerField()

    def __str__(self) -> str:
        return f"{self.node_id} load at {self.sampled_at:%H:%M:%S}"


class ShardLoad(models.Model):
    """The latest CPU and memory of one engine's process group, and its GPU memory."""

    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="shard_loads")
    shard_id = models.CharField(max_length=100)
    sampled_at = models.DateTimeField()
    cpu_cores = models.FloatField("CPU cores")
    rss_bytes = models.PositiveBigIntegerField("RSS (bytes)")
    gpu_memory_mb = models.PositiveIntegerField(
        "GPU memory (MiB)",
        null=True,
        blank=True,
        help_text="What the group's processes hold on the GPU where they hold the most, "
        "as NVML lists them. Empty: not measured.",
    )

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["node", "shard_id"], name="shard_load_unique"),
        ]

    def __str__(self) -> str:
        return f"{self.node_id}:{self.shard_id}"
