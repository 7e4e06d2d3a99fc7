"""The catalog: which models should run, by name, how many of them, and the rules on them
(autoscaling, sleep, canaries, fallbacks, teams). How each replica runs is its engine
profile's (``profiles``)."""

from django.apps import apps
from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator, RegexValidator
from django.db import models
from django.urls import reverse
from django.utils import timezone

from .choices import PlacementPolicy, SleepLevel

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
