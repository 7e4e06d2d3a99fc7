"""Teams: who owns which models and API keys, and how much of the fleet they may take.

A team's members are the users of its Django group, so a single sign-on's
groups claim makes someone a member with no step of its own. Members manage
their team's models and keys and see the rest read-only
(fleet.services.teams). Its quotas bound what placement gives its models and
what the gateway lets its keys spend; empty is no bound.
"""

from django.contrib.auth.models import Group
from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models

from .catalog import PRIORITY_MAX, name_validator
from .costs import currency_validator, default_currency


class Team(models.Model):
    name = models.CharField(
        max_length=64,
        unique=True,
        validators=[name_validator],
        help_text="How placement's reasons, the cluster page and the audit trail name it.",
    )
    description = models.TextField(blank=True)
    group = models.OneToOneField(
        Group,
        on_delete=models.PROTECT,
        related_name="team",
        help_text="Its members: the users in this group (with single sign-on, the "
        "provider's group of the same name). Their group permissions say what they may "
        "do; the team, on which models and keys.",
    )
    max_gpus = models.PositiveIntegerField(
        "GPU quota",
        null=True,
        blank=True,
        help_text="GPUs its replicas may hold at once, whole or shared (a share counts as "
        "one). Empty: no bound.",
    )
    max_gpu_memory_gb = models.PositiveIntegerField(
        "GPU memory quota (GB)",
        null=True,
        blank=True,
        help_text="GPU memory its replicas may hold at once: a whole GPU counts all of its "
        "memory, a share what its profile asks. Empty: no bound.",
    )
    max_replicas = models.PositiveIntegerField(
        "replica quota",
        null=True,
        blank=True,
        help_text="Replicas of its models placed at once; more wait, pending, with the "
        "reason. Empty: no bound.",
    )
    tokens_per_month = models.PositiveBigIntegerField(
        "tokens per month",
        null=True,
        blank=True,
        help_text="Prompt + completion tokens per UTC calendar month across all of its "
        "API keys; past it the gateway answers 429. Empty: no bound.",
    )
    # Capacity across teams (docs/security.md, "Teams"): both set only by those with
    # fleet.manage_all_teams (fleet.services.reach).
    max_priority = models.PositiveSmallIntegerField(
        "maximum priority",
        default=0,
        validators=[MaxValueValidator(PRIORITY_MAX)],
        help_text=f"The highest priority its models may have, 0 to {PRIORITY_MAX}: a "
        "priority lets a replica take the place of others. Set only by those with the "
        "permission fleet.manage_all_teams.",
    )
    guaranteed_gpu_memory_gb = models.PositiveIntegerField(
        "guaranteed GPU memory (GB)",
        null=True,
        blank=True,
        help_text="GPU memory its replicas keep against other teams' priorities: while the "
        "team holds no more than this, no other team's replica takes the place of one of "
        "its own. What it holds above this is borrowed, and another team's replica of "
        "higher priority may take it back. Empty: nothing guaranteed. Set only by those "
        "with the permission fleet.manage_all_teams.",
    )
    # A budget in money (docs/operations.md, "What the fleet costs"): what its models' GPU-hours
    # cost this UTC month, as the accrual (fleet.services.costs) priced them.
    budget_per_month = models.DecimalField(
        "budget per month",
        max_digits=14,
        decimal_places=2,
        null=True,
        blank=True,
        validators=[MinValueValidator(0)],
        help_text="What its models may cost per UTC calendar month, in the budget's currency; "
        "once spent, the gateway answers its keys 429. Empty: no bound.",
    )
    budget_currency = models.CharField(
        max_length=3,
        default=default_currency,
        validators=[currency_validator],
        help_text="Costs priced in another currency are not counted against it.",
    )
    budget_warn_percent = models.PositiveSmallIntegerField(
        "warn at (%)",
        default=80,
        validators=[MinValueValidator(1), MaxValueValidator(100)],
        help_text="An event (and a metric) once this share of the budget is spent.",
    )
    # Derived by the accrual: read-only in the admin.
    spent_this_month = models.DecimalField(
        "spent this month",
        max_digits=18,
        decimal_places=6,
        default=0,
        editable=False,
        help_text="What its models cost so far this UTC month, in the budget's currency.",
    )
    spent_updated_at = models.DateTimeField(
        null=True, blank=True, editable=False, help_text="When the accrual last counted it."
    )
    # The part of the month that no count changes any more, summed once an hour rather
    # than on every count (fleet.services.costs.budgets): the month's rows before its
    # first open hour, in the budget's currency, and which hour and currency those were.
    spent_closed = models.DecimalField(max_digits=18, decimal_places=6, default=0, editable=False)
    spent_closed_key = models.CharField(
        max_length=64,
        blank=True,
        editable=False,
        help_text="The first open hour and the currency spent_closed was summed to; "
        "empty: to be summed again.",
    )
    budget_warned_at = models.DateTimeField(
        null=True,
        blank=True,
        editable=False,
        help_text="When it passed its warning threshold this month. Empty: not yet.",
    )
    budget_spent_at = models.DateTimeField(
        null=True,
        blank=True,
        editable=False,
        help_text="When it spent its budget this month; its keys are refused since. "
        "Empty: not spent.",
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]
        permissions = [
            # Without it, a member of a team changes only that team's models and
            # keys, and someone in no team only those of no team.
            ("manage_all_teams", "Can change the models and API keys of every team"),
        ]

    def __str__(self) -> str:
        return self.name

    def clean(self) -> None:
        errors = {}
        guaranteed, quota = self.guaranteed_gpu_memory_gb, self.max_gpu_memory_gb
        if guaranteed is not None and quota is not None and guaranteed > quota:
            errors["guaranteed_gpu_memory_gb"] = (
                f"{guaranteed} GB guaranteed is more than the team's GPU memory quota of {quota} GB"
            )
        if self.pk is not None and self.max_priority is not None:
            above = list(
                self.models.filter(priority__gt=self.max_priority)
                .order_by("-priority", "name")
                .values_list("name", "priority")[:5]
            )
            if above:
                named = ", ".join(f"'{n}' ({p})" for n, p in above)
                errors["max_priority"] = (
                    f"team '{self.name}' has models above priority {self.max_priority}: "
                    f"{named}; lower theirs first"
                )
        if errors:
            raise ValidationError(errors)
