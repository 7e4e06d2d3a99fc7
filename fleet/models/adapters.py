"""LoRA adapters: fine-tunes of a model, served by the replicas of that model.

An adapter is asked for by its own name, like a model; the gateway sends it to
a ready replica of its base model that holds it (fleet.gateway.table). Each
replica holds at most its profile's ``max_adapters`` at once: those asked for
most recently (fleet.services.adapters). Its files come from the same sources
as weights, fetched and verified by the node (agentd.fetch).
"""

from django.core.exceptions import ValidationError
from django.db import models

from .catalog import Model, name_validator
from .fetched import fetch_errors

# What vLLM accepts as --max-lora-rank (its LoRAConfig), and so a rank an adapter may state.
RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


class Adapter(models.Model):
    name = models.CharField(
        max_length=128,
        unique=True,
        validators=[name_validator],
        help_text="The name clients ask for in the OpenAI API, as for a model.",
    )
    model = models.ForeignKey(
        Model,
        on_delete=models.CASCADE,
        related_name="adapters",
        verbose_name="base model",
        help_text="The model it was fine-tuned from: that model's replicas serve it.",
    )
    description = models.TextField(blank=True)
    source = models.CharField(
        max_length=1024,
        help_text="Where its files are: a path on the node, an https:// URL of one file, "
        "or hf://org/name[/path][@revision]; the node fetches the last two, like weights. "
        "llama.cpp loads one .gguf file; vLLM and SGLang a PEFT folder.",
    )
    sha256 = models.JSONField(
        "sha256",
        default=dict,
        blank=True,
        help_text='Optional checksums of fetched files: {"file name": "64 hex digits"}.',
    )
    rank = models.PositiveSmallIntegerField(
        null=True,
        blank=True,
        help_text="Its LoRA rank, where known. vLLM and SGLang hold ranks up to 16 unless "
        "the profile's args raise --max-lora-rank.",
    )
    # Observed by the reconciler from the gateways' reports: least recently asked for
    # is unloaded first when a replica holds its profile's max_adapters.
    last_request_at = models.DateTimeField(
        null=True, blank=True, editable=False, help_text="The last request any gateway saw."
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["model", "name"]

    def __str__(self) -> str:
        return self.name

    def clean(self) -> None:
        errors = {}
        if self.name and Model.objects.filter(name=self.name).exists():
            errors["name"] = f"'{self.name}' is a model's name; an adapter needs a name of its own"
        errors.update(fetch_errors(self.source, self.sha256, "source", "sha256"))
        if self.rank is not None and self.rank not in RANKS:
            errors["rank"] = (
                f"rank {self.rank} is not one engines take; one of {', '.join(map(str, RANKS))}"
            )
        if errors:
            raise ValidationError(errors)
