"""Engine profiles: how a model's replicas run — the engine, its parallelism, GPUs,
arguments, weights and requirements — and the spec a shard of one is started with
(a change of it rolls the running replicas). Which models run, and how many, is the
catalog's (``catalog``)."""

import hashlib
import json

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models

from fleet.selectors import parse_selector

from .catalog import Model, name_validator
from .choices import Engine
from .fetched import fetch_errors

# More than any GPU has: a typo, not a share.
GPU_MEMORY_GB_MAX = 1024


class EngineProfile(models.Model):
    """How to run a model: the engine, its parallelism, GPUs, arguments and requirements.

    ``tp × pp`` GPUs serve one replica, spread as ``gpus_per_node`` on each of
    ``nodes`` nodes. A CPU profile has ``gpus_per_node`` 0.
    """

    model = models.ForeignKey(Model, on_delete=models.CASCADE, related_name="profiles")
    name = models.CharField(max_length=128, validators=[name_validator])
    engine = models.CharField(max_length=32, choices=Engine.choices)
    gpu_class = models.CharField(
        "GPU class",
        max_length=128,
        blank=True,
        help_text="A substring of the GPU name, e.g. 'H100'. Empty: any.",
    )
    tp = models.PositiveSmallIntegerField(
        "tensor parallel", default=1, validators=[MinValueValidator(1)]
    )
    pp = models.PositiveSmallIntegerField(
        "pipeline parallel", default=1, validators=[MinValueValidator(1)]
    )
    gpus_per_node = models.PositiveSmallIntegerField(default=0)
    gpu_memory_gb = models.FloatField(
        "GPU memory per GPU (GB)",
        null=True,
        blank=True,
        help_text="A share of each GPU instead of whole GPUs: the memory each shard may use "
        "on each of its gpus_per_node GPUs, so several models can share a GPU. "
        "Empty: whole GPUs, never shared.",
    )
    nodes = models.PositiveSmallIntegerField(default=1, validators=[MinValueValidator(1)])
    args = models.JSONField(default=list, blank=True, help_text="Extra engine arguments.")
    env = models.JSONField(default=dict, blank=True, help_text="Extra environment variables.")
    model_path = models.CharField(
        max_length=1024,
        help_text="Where the weights are: a path on the node (or a hub id the engine "
        "resolves itself), an https:// URL of one file, or hf://org/name[@revision] (a "
        "repository; hf://org/name/path/in/repo[@revision] one file or folder of it); "
        "the node fetches the last two before starting the engine (docs/weights.md).",
    )
    weights_sha256 = models.JSONField(
        "weights sha256",
        default=dict,
        blank=True,
        help_text='Optional checksums of fetched files: {"file name": "64 hex digits"}. For '
        "a URL the name is its last path part; for a hub repository, the path in it.",
    )
    served_model_name = models.CharField(
        max_length=255, blank=True, help_text="Name the engine serves. Empty: the model's name."
    )
    min_memory_gb = models.PositiveIntegerField(
        "minimum memory (GB)",
        null=True,
        blank=True,
        help_text="Node RAM the engine needs. Empty: the estimate for a CPU profile (below), "
        "else fits anywhere.",
    )
    context_tokens = models.PositiveIntegerField(
        null=True,
        blank=True,
        help_text="The context length the memory estimate counts the KV cache for. "
        "Empty: the model's own.",
    )
    sequences = models.PositiveSmallIntegerField(
        "concurrent sequences",
        default=1,
        validators=[MinValueValidator(1)],
        help_text="Sequences at once the memory estimate counts the KV cache for.",
    )
    # fleet.services.estimate, refreshed by beat when model_path, context_tokens or
    # sequences change: {"key", "total_bytes", "text", ...} or {"key", "error"}.
    estimate = models.JSONField(
        "memory estimate",
        default=dict,
        blank=True,
        editable=False,
        help_text="What the model needs, read from its weights' headers before placement.",
    )
    node_selector = models.CharField(
        max_length=1024,
        blank=True,
        help_text="Label selector, e.g. 'gpu=h100,zone!=b,coding'.",
    )
    startup_timeout_s = models.PositiveIntegerField("startup timeout (s)", default=1800)
    max_adapters = models.PositiveSmallIntegerField(
        "max adapters",
        default=0,
        validators=[MaxValueValidator(64)],
        help_text="LoRA adapters of the model each replica holds at once, up to 64; when "
        "more are asked for, the least recently used is unloaded. 0: none (LoRA off).",
    )
    # args and env reach the engine process on every node that runs this
    # profile (an LD_PRELOAD, a --trust-remote-code): who set them last is kept.
    args_env_changed_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
        editable=False,
        verbose_name="args/env last changed by",
        help_text="Who last set the arguments or environment. Empty: never set, "
        "or set from the command line (apply -f).",
    )
    args_env_changed_at = models.DateTimeField(
        "args/env last changed at", null=True, blank=True, editable=False
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    # Setting args or env is running code on the fleet; change_engineprofile
    # alone does not allow it (docs/security.md).
    ARGS_ENV_PERMISSION = "fleet.set_engine_args_env"

    class Meta:
        ordering = ["model", "name"]
        constraints = [
            models.UniqueConstraint(fields=["model", "name"], name="profile_unique_per_model"),
        ]
        permissions = [
            ("set_engine_args_env", "Can set engine arguments and environment (code on nodes)"),
        ]

    def __str__(self) -> str:
        return f"{self.model.name}/{self.name}" if self.model_id else self.name

    @property
    def gpus_total(self) -> int:
        return self.gpus_per_node * self.nodes

    # What the engine process is started with. Changing any of it makes the
    # reconciler replace running replicas, one at a time.
    SPEC_FIELDS = (
        "engine",
        "gpu_class",
        "tp",
        "pp",
        "gpus_per_node",
        "nodes",
        "args",
        "env",
        "model_path",
        "served_model_name",
        "weights_sha256",
        "gpu_memory_gb",
        "max_adapters",
    )
    # Left out of the spec and its hash while empty: profiles from before they
    # existed keep their hash, and their running replicas are not rolled by an upgrade.
    SPEC_OPTIONAL = ("weights_sha256", "gpu_memory_gb", "max_adapters")

    def spec(self) -> dict:
        """What a shard of this profile runs, as its desired set carries it."""
        spec = {f: getattr(self, f) for f in ("name", *self.SPEC_FIELDS)}
        spec["served_model_name"] = self.served_model_name or self.model.name
        for name in ("gpu_memory_gb", "max_adapters"):
            if not spec[name]:
                del spec[name]
        return {"model": self.model.name, "profile": spec}

    @property
    def spec_hash(self) -> str:
        spec = {f: getattr(self, f) for f in self.SPEC_FIELDS}
        for name in self.SPEC_OPTIONAL:
            if spec[name] in (None, {}, 0):
                del spec[name]
        return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()

    def clean(self) -> None:
        errors: dict[str, str] = {}
        if self.engine and self.engine not in Engine.values:
            errors["engine"] = (
                f"unknown engine '{self.engine}'; choose one of {', '.join(Engine.values)}"
            )
        tp, pp = self.tp or 0, self.pp or 0
        gpn, nodes = self.gpus_per_node or 0, self.nodes or 0
        if gpn and tp * pp != gpn * nodes:
            errors["tp"] = (
                f"tp × pp ({tp} × {pp} = {tp * pp}) must equal gpus_per_node × nodes "
                f"({gpn} × {nodes} = {gpn * nodes})"
            )
        if not gpn and nodes > 1 and self.engine != Engine.LLAMACPP:
            # llama.cpp's RPC spreads layers over nodes' CPUs too; the others need GPUs.
            errors["nodes"] = (
                "a CPU profile (gpus_per_node 0) runs on one node; only llama.cpp spreads "
                "one over nodes without GPUs"
            )
        if self.gpu_memory_gb is not None:
            if not gpn:
                errors["gpu_memory_gb"] = (
                    "a share of GPU memory needs GPUs: set gpus_per_node to 1 or more"
                )
            elif not 0 < self.gpu_memory_gb <= GPU_MEMORY_GB_MAX:
                errors["gpu_memory_gb"] = (
                    f"gpu_memory_gb must be more than 0 and at most {GPU_MEMORY_GB_MAX}, "
                    f"not {self.gpu_memory_gb:g}"
                )
        if not gpn and self.engine == Engine.SGLANG:
            # vLLM has a CPU build (agentd/builds.py); SGLang's is built from source
            # only (docs/engines.md, "SGLang on CPU nodes").
            errors["gpus_per_node"] = f"{self.get_engine_display()} needs at least one GPU"
        try:
            parse_selector(self.node_selector)
        except ValueError as exc:
            errors["node_selector"] = str(exc)
        if not isinstance(self.args, list) or not all(isinstance(a, str) for a in self.args):
            errors["args"] = "args must be a list of strings"
        errors.update(
            fetch_errors(self.model_path, self.weights_sha256, "model_path", "weights_sha256")
        )
        if not isinstance(self.env, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in self.env.items()
        ):
            errors["env"] = "env must map names to string values"
        if errors:
            raise ValidationError(errors)
