"""The catalog: which models should run, and how (engine profiles)."""

import hashlib
import json

from django.apps import apps
from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator, RegexValidator
from django.db import models
from django.urls import reverse
from django.utils import timezone

from agentd.fetch import sources
from fleet.selectors import parse_selector

from .choices import Engine, PlacementPolicy, SleepLevel

PRIORITY_MAX = 100

name_validator = RegexValidator(
    r"^[A-Za-z0-9][A-Za-z0-9._:/-]{0,127}$",
    "use letters, digits, '.', '_', ':', '/' or '-', starting alphanumeric",
)


# Fallbacks a model may name: a short list, tried in order.
FALLBACKS_MAX = 8


def fallbacks_problem(names, *, own: str | None = None, check_names: bool = True) -> str | None:
    """Why ``names`` is not a list of fallbacks (a model's, or an API key's), else None."""
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        return f'fallbacks must be a list of model names, e.g. ["qwen-32b"] (got {names!r})'
    if len(names) > FALLBACKS_MAX:
        return f"at most {FALLBACKS_MAX} fallbacks (got {len(names)})"
    if own is not None and own in names:
        return f"'{own}' cannot fall back to itself"
    if len(set(names)) != len(names):
        return f"a fallback is named twice: {names}"
    if check_names:
        known = set(Model.objects.filter(name__in=names).values_list("name", flat=True))
        if missing := [n for n in names if n not in known]:
            return f"no model named {', '.join(repr(n) for n in missing)}"
    return None


class Model(models.Model):
    """A model operators want served, by its served name, with a number of replicas.

    Its ``active_profile`` says how each replica runs; changing it is a rolling
    replacement (the reconciler's job).
    """

    name = models.CharField(
        max_length=128,
        unique=True,
        validators=[name_validator],
        help_text="The name clients ask for in the OpenAI API.",
    )
    description = models.TextField(blank=True)
    team = models.ForeignKey(
        "Team",
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="models",
        help_text="The team that owns it: its members manage it, its quotas bound it. "
        "Empty: the fleet's, managed by those in no team.",
    )
    desired_replicas = models.IntegerField(
        default=1,
        help_text="How many replicas should run. With autoscaling (min and max replicas set), "
        "the current target, which the autoscaler moves between them.",
    )
    # Autoscaling (fleet.services.autoscaler): on when both bounds are set.
    min_replicas = models.PositiveIntegerField(
        null=True,
        blank=True,
        help_text="Autoscaling's floor; 0 lets the model scale to zero when idle. "
        "Empty, with max replicas empty: no autoscaling, desired replicas is fixed.",
    )
    max_replicas = models.PositiveIntegerField(
        null=True, blank=True, help_text="Autoscaling's ceiling. Set with min replicas."
    )
    scale_to_zero_after_s = models.PositiveIntegerField(
        "scale to zero after (s)",
        null=True,
        blank=True,
        help_text="With min replicas 0: no request for this long scales the model to zero "
        "(its weights stay on the nodes). Empty: never.",
    )
    # Sleep (docs/operations.md, "Sleep and wake"): idle replicas give their GPUs back
    # and keep their engines, so a request wakes them in seconds rather than minutes.
    sleep_after_s = models.PositiveIntegerField(
        "sleep after (s)",
        null=True,
        blank=True,
        help_text="No request for this long puts the model's replicas to sleep: their GPU "
        "memory is given back and a request wakes them. Replicas of models that sleep may "
        "take turns on one GPU, the least recently used asleep. Empty: never.",
    )
    sleep_level = models.PositiveSmallIntegerField(
        choices=SleepLevel.choices,
        default=SleepLevel.KEEP_WEIGHTS,
        help_text="1: the weights stay in the node's memory (a wake copies them back); "
        "2: they are dropped and reloaded from disk. Engines that sleep by stopping "
        "(llama.cpp) keep them in the page cache either way.",
    )
    stop_after_asleep_s = models.PositiveIntegerField(
        "stop after asleep (s)",
        null=True,
        blank=True,
        help_text="With min replicas 0: asleep this long, the model is scaled to zero (its "
        "engines stop and its host memory is free). Empty: it stays asleep.",
    )
    target_outstanding = models.FloatField(
        "target outstanding per replica",
        null=True,
        blank=True,
        help_text="Requests in flight per ready replica the autoscaler aims at. "
        "Empty: the fleet default (LLMGW_AUTOSCALE_TARGET_OUTSTANDING).",
    )
    max_waiting = models.PositiveIntegerField(
        "max waiting requests",
        null=True,
        blank=True,
        help_text="Requests each gateway process holds while no replica is ready; more get "
        "503. Empty: the fleet default (LLMGW_GATEWAY_WAIT_QUEUE).",
    )
    max_wait_s = models.PositiveIntegerField(
        "max wait (s)",
        null=True,
        blank=True,
        help_text="How long a request waits for a replica before 503. "
        "Empty: the fleet default (LLMGW_GATEWAY_WAIT_TIMEOUT_S).",
    )
    # Observed by the reconciler from the gateways' load reports.
    last_request_at = models.DateTimeField(
        null=True, blank=True, editable=False, help_text="The last request any gateway saw."
    )
    waiting_requests = models.PositiveIntegerField(
        default=0,
        editable=False,
        help_text="Requests waiting at the gateways for a replica, at the last pass.",
    )
    last_scaled_at = models.DateTimeField(
        null=True, blank=True, editable=False, help_text="The autoscaler's last decision."
    )
    placement_policy = models.CharField(
        max_length=16, choices=PlacementPolicy.choices, default=PlacementPolicy.BINPACK
    )
    priority = models.PositiveSmallIntegerField(
        default=0,
        validators=[MaxValueValidator(PRIORITY_MAX)],
        help_text=f"0 to {PRIORITY_MAX}, and no more than its team's maximum priority. A "
        "replica that finds no GPU memory may take the place of replicas of lower priority "
        "(they drain first, then wait for room): its own team's, the fleet's, and another "
        "team's only while that team holds more than its guaranteed GPU memory; never of "
        "equal or higher priority.",
    )
    private = models.BooleanField(
        "only its team's keys",
        default=False,
        help_text="Only API keys of its team may call it or its adapters, directly or as a "
        "fallback. Off: any key whose allowed models include it. A model of no team is the "
        "fleet's, open to every key.",
    )
    fallbacks = models.JSONField(
        default=list,
        blank=True,
        help_text="Models to answer in this one's stead, in order, when it has no ready "
        "replica past its waiting bounds or every try at its replicas failed; the "
        'answer says so (x-llmgw-fallback). A list of model names, e.g. ["qwen-32b"].',
    )
    prefix_routing = models.BooleanField(
        "prefix-aware routing",
        default=False,
        help_text=(
            "Send requests whose prompts begin alike (system prompt, first messages) to the "
            "same replica, which has that prefix cached, while its load allows. Off: the "
            "least busy replica takes each request."
        ),
    )
    replace_after_s = models.PositiveIntegerField(
        "replace after (s)",
        null=True,
        blank=True,
        help_text="Replace replicas on a silent node after this long. Empty: the fleet default.",
    )
    weights_retention_s = models.PositiveIntegerField(
        "weights retention (s)",
        null=True,
        blank=True,
        help_text="How long this model's weights stay on a node nothing there needs them "
        "any more. Empty: the fleet default (LLMGW_WEIGHTS_RETENTION_S).",
    )
    active_profile = models.ForeignKey(
        "EngineProfile",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
        help_text="The profile new replicas use.",
    )
    # A canary (docs/operations.md, "Canaries"): a second profile beside the active
    # one, with a share of the traffic, until it is promoted or aborted.
    canary_profile = models.ForeignKey(
        "EngineProfile",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
        help_text="A second profile run beside the active one, with canary_percent of the "
        "requests; promote makes it the active one, abort drains it.",
    )
    canary_percent = models.PositiveSmallIntegerField(
        default=0,
        validators=[MaxValueValidator(99)],
        help_text="The share of requests the canary gets, 1 to 99 (0 without a canary).",
    )
    # Its bounds: past one, the reconciler aborts it; within them for its window, it
    # may promote it (fleet.services.canary.judge).
    canary_max_error_rate = models.FloatField(
        null=True,
        blank=True,
        validators=[MinValueValidator(0.0), MaxValueValidator(1.0)],
        help_text="Abort the canary when more of its answers than this (0 to 1) are 5xx.",
    )
    canary_max_ttft_ratio = models.FloatField(
        null=True,
        blank=True,
        validators=[MinValueValidator(1.0)],
        help_text="Abort the canary when its p95 time to first token is more than this many "
        "times the active profile's (1 or more).",
    )
    canary_window_s = models.PositiveIntegerField(
        default=300,
        validators=[MinValueValidator(10)],
        help_text="How long a canary is watched before it may be promoted automatically; "
        "one with no ready replica by then is aborted.",
    )
    canary_min_requests = models.PositiveIntegerField(
        default=100,
        validators=[MinValueValidator(1)],
        help_text="Answers the canary must have given before its bounds are judged.",
    )
    canary_auto_promote = models.BooleanField(
        default=False,
        help_text="Promote the canary once it stayed within its bounds for its window.",
    )
    canary_started_at = models.DateTimeField(
        null=True, blank=True, editable=False, help_text="When the canary began."
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    def save(self, *args, **kwargs):
        # A new canary (or none) starts its window again.
        before = (
            Model.objects.filter(pk=self.pk).values_list("canary_profile_id", flat=True).first()
            if self.pk
            else None
        )
        if before != self.canary_profile_id:
            self.canary_started_at = timezone.now() if self.canary_profile_id else None
            if kwargs.get("update_fields") is not None:
                kwargs["update_fields"] = {*kwargs["update_fields"], "canary_started_at"}
        super().save(*args, **kwargs)

    def get_absolute_url(self) -> str:
        """Its console page: the admin's "View on site" goes there."""
        return reverse("console:model", args=[self.pk])

    def fallbacks_problem(self) -> str | None:
        # A catalog file: its later models may be the fallbacks, checked once all are in.
        later = getattr(self, "fallbacks_checked_later", False)
        return fallbacks_problem(self.fallbacks, own=self.name, check_names=not later)

    def canary_errors(self) -> dict[str, str]:
        if getattr(self, "canary_checked_later", False):
            return {}  # a catalog file: its profiles are applied after the model
        if self.canary_profile_id is None:
            if self.canary_percent:
                return {"canary_percent": "canary_percent needs a canary_profile (or 0)"}
            return {}
        profile = self.canary_profile
        if profile.model_id != self.pk:
            return {"canary_profile": f"profile '{profile.name}' belongs to another model"}
        if profile.pk == self.active_profile_id:
            return {"canary_profile": f"'{profile.name}' is the active profile already"}
        if not 1 <= (self.canary_percent or 0) <= 99:
            return {
                "canary_percent": f"a canary gets 1 to 99 % of the requests "
                f"(got {self.canary_percent})"
            }
        return {}

    def clean(self) -> None:
        errors = {}
        if self.name and self.adapter_named(self.name):
            errors["name"] = f"'{self.name}' is an adapter's name; a model needs a name of its own"
        if self.desired_replicas is not None and self.desired_replicas < 0:
            errors["desired_replicas"] = (
                f"replicas cannot be negative (got {self.desired_replicas})"
            )
        errors.update(self._autoscale_errors())
        if problem := self.fallbacks_problem():
            errors["fallbacks"] = problem
        errors.update(self._team_errors())
        errors.update(self.canary_errors())
        if self.active_profile_id and self.active_profile.model_id != self.pk:
            errors["active_profile"] = (
                f"profile '{self.active_profile.name}' belongs to another model"
            )
        if errors:
            raise ValidationError(errors)

    def _team_errors(self) -> dict[str, str]:
        # The rules that need no actor; those that do are fleet.services.reach's.
        errors = {}
        team = self.team if self.team_id else None
        if team is None:
            if self.private:
                errors["private"] = (
                    "a model of no team is the fleet's, open to every key; give it a team first"
                )
        elif (self.priority or 0) > team.max_priority:
            errors["priority"] = (
                f"priority {self.priority} is above the maximum of team '{team.name}', "
                f"{team.max_priority} (a team's maximum priority is set by those with the "
                "permission fleet.manage_all_teams)"
            )
        return errors

    @staticmethod
    def adapter_named(name: str) -> bool:
        # Through the app registry: fleet.models.adapters imports this module.
        return apps.get_model("fleet", "Adapter").objects.filter(name=name).exists()

    @property
    def autoscaled(self) -> bool:
        return self.min_replicas is not None and self.max_replicas is not None

    def _autoscale_errors(self) -> dict[str, str]:
        lo, hi, idle = self.min_replicas, self.max_replicas, self.scale_to_zero_after_s
        if (lo is None) != (hi is None):
            field = "max_replicas" if hi is None else "min_replicas"
            return {field: "set min_replicas and max_replicas together (autoscaling), or neither"}
        errors = {}
        if hi is not None and hi < 1:
            errors["max_replicas"] = "max_replicas must be at least 1"
        elif lo is not None and lo > hi:
            errors["min_replicas"] = f"min_replicas {lo} is above max_replicas {hi}"
        stop = self.stop_after_asleep_s
        if idle is not None and lo != 0:
            errors["scale_to_zero_after_s"] = (
                f"scale_to_zero_after_s needs min_replicas 0 (got {'none' if lo is None else lo})"
            )
        elif lo == 0 and idle is None and stop is None:
            errors["scale_to_zero_after_s"] = (
                "min_replicas 0 needs scale_to_zero_after_s: how long without a request "
                "before the model is scaled to zero (or stop_after_asleep_s, with sleep_after_s)"
            )
        elif idle is not None and idle < 1:
            errors["scale_to_zero_after_s"] = "scale_to_zero_after_s must be at least 1"
        errors.update(self._sleep_errors())
        if self.target_outstanding is not None and not self.target_outstanding > 0:
            errors["target_outstanding"] = (
                f"target_outstanding must be above 0 (got {self.target_outstanding})"
            )
        if self.max_waiting is not None and self.max_waiting < 1:
            # A request that waits is the demand that starts a model at zero.
            errors["max_waiting"] = "max_waiting must be at least 1"
        if self.max_wait_s is not None and self.max_wait_s < 1:
            errors["max_wait_s"] = "max_wait_s must be at least 1"
        return errors

    def _sleep_errors(self) -> dict[str, str]:
        errors = {}
        after, stop, lo = self.sleep_after_s, self.stop_after_asleep_s, self.min_replicas
        if after is not None and after < 1:
            errors["sleep_after_s"] = "sleep_after_s must be at least 1"
        if self.sleep_level not in SleepLevel.values:
            errors["sleep_level"] = f"sleep_level is 1 or 2 (got {self.sleep_level!r})"
        if stop is not None:
            if after is None:
                errors["stop_after_asleep_s"] = (
                    "stop_after_asleep_s needs sleep_after_s: a model that never sleeps is "
                    "never asleep"
                )
            elif lo != 0:
                errors["stop_after_asleep_s"] = (
                    "stop_after_asleep_s needs min_replicas 0 (got "
                    f"{'none' if lo is None else lo}): stopping its replicas scales it to zero"
                )
            elif stop < 1:
                errors["stop_after_asleep_s"] = "stop_after_asleep_s must be at least 1"
        return errors


def fetch_errors(text: str, sums, where: str, sums_where: str) -> dict[str, str]:
    """What is wrong with a source of files a node fetches (a profile's weights, an
    adapter's) and its checksums, by field; {} when nothing is."""
    errors = {}
    try:
        source = sources.parse(text or "")
    except sources.SourceError as exc:
        errors[where] = str(exc)
        source = None
    if problems := sources.check_sha256(sums):
        errors[sums_where] = "; ".join(problems)
    elif where in errors or not sums:
        pass  # the checksums are judged against a source once it is a valid one
    elif source is None:
        errors[sums_where] = (
            f"checksums are for files the node fetches: {where} must be an "
            "https:// URL or hf://org/name[/path][@revision]"
        )
    elif names := sorted(n for n in sums if not source.holds(n)):
        if source.kind == sources.URL:
            errors[sums_where] = (
                f"the URL fetches one file, {source.file_name}; not {', '.join(names)}"
            )
        else:
            errors[sums_where] = (
                f"{source.text} fetches only {source.path} (and what is under it or "
                f"split from it); not {', '.join(names)}: name files by their path "
                "in the repository"
            )
    return errors


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
