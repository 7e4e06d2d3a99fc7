"""What the fleet costs: prices per GPU class, and the hours they price (docs/operations.md).

``Price`` is operator intent: what an hour of a GPU class (or of a CPU-only node)
costs, from a date on. ``CostHour`` is derived: what each model, team and the
fleet's idle held in one UTC hour, written by the accrual (fleet.services.costs)
a minute at a time and closed once the hour is over. Pages, the API and budgets
read ``CostHour`` only, never the replicas' history.
"""

from django.core.validators import MinValueValidator, RegexValidator
from django.db import models


def default_currency() -> str:
    from fleet.conf import fleet_settings

    return fleet_settings().cost_currency


currency_validator = RegexValidator(r"^[A-Z]{3}$", "a currency is three capital letters, e.g. USD")


class Price(models.Model):
    """What an hour of a GPU class costs, from ``effective_from`` to its class's next price.

    The class matches GPU names as a profile's ``gpu_class`` does: a case-blind
    substring, so "H100" prices an "NVIDIA H100 80GB HBM3". Where several
    classes match a GPU, the longest wins ("H100 NVL" over "H100"). An empty
    class prices an hour of a node without GPUs.
    """

    gpu_class = models.CharField(
        "GPU class",
        max_length=64,
        blank=True,
        help_text="A substring of the GPU name, e.g. 'H100'. Empty: an hour of a CPU-only node.",
    )
    per_hour = models.DecimalField(
        "price per hour",
        max_digits=12,
        decimal_places=4,
        validators=[MinValueValidator(0)],
        help_text="What one GPU (or one CPU-only node) of this class costs for an hour.",
    )
    currency = models.CharField(
        max_length=3, default=default_currency, validators=[currency_validator]
    )
    effective_from = models.DateTimeField(
        help_text="It prices the hour this falls in and those after, until the next price "
        "of its class."
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["gpu_class", "-effective_from"]
        constraints = [
            models.UniqueConstraint(
                fields=["gpu_class", "effective_from"], name="price_unique_class_from"
            ),
        ]

    def __str__(self) -> str:
        return (
            f"{self.gpu_class or 'CPU node'}: {self.per_hour} {self.currency}/h "
            f"from {self.effective_from:%Y-%m-%d %H:%M}"
        )


class CostHour(models.Model):
    """What one model of one team held of one GPU class in one UTC hour, or what nobody held.

    One row per (hour, idle, GPU class, model, team). The names are kept with the
    links, so a row outlives a deleted model or team. ``gpu_seconds`` counts a
    share of a GPU by its share; a CPU-only node's row counts node-seconds.
    """

    hour = models.DateTimeField(db_index=True, help_text="The start of the hour, UTC.")
    team = models.ForeignKey(
        "Team", null=True, blank=True, on_delete=models.SET_NULL, related_name="cost_hours"
    )
    team_name = models.CharField(max_length=64, blank=True, help_text="Empty: the fleet's.")
    model = models.ForeignKey(
        "Model", null=True, blank=True, on_delete=models.SET_NULL, related_name="cost_hours"
    )
    model_name = models.CharField(max_length=128, blank=True, help_text="Empty: idle.")
    idle = models.BooleanField(
        default=False, help_text="What the fleet's GPUs (or CPU-only nodes) held no replica for."
    )
    gpu_class = models.CharField(
        "GPU",
        max_length=255,
        blank=True,
        help_text="The GPU's name as NVML reports it (priced by the longest price class it "
        "contains). Empty: a CPU-only node.",
    )
    gpu_seconds = models.FloatField(
        "GPU-seconds", default=0.0, help_text="A share of a GPU counts its share."
    )
    cost = models.DecimalField(max_digits=18, decimal_places=6, default=0)
    currency = models.CharField(max_length=3, default=default_currency)
    tokens = models.PositiveBigIntegerField(
        default=0,
        help_text="Prompt + completion tokens the model served in the hour, on one of its rows "
        "(the class it held most).",
    )
    closed = models.BooleanField(
        default=False, help_text="The hour is over and its tokens and cost are final."
    )

    class Meta:
        ordering = ["-hour", "idle", "team_name", "model_name", "gpu_class"]
        constraints = [
            models.UniqueConstraint(
                fields=["hour", "idle", "gpu_class", "model_name", "team_name"],
                name="cost_hour_unique",
            ),
        ]
        indexes = [models.Index(fields=["closed", "hour"], name="cost_hour_open")]
        verbose_name = "cost hour"

    def __str__(self) -> str:
        who = "idle" if self.idle else f"{self.team_name or '-'}/{self.model_name}"
        return f"{self.hour:%Y-%m-%d %H}:00 {who} {self.gpu_class or 'CPU'}"
