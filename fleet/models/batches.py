"""The Batch API's rows: files clients upload or batches write, batches, and each line's answer.

A ``BatchFile`` is a JSONL file kept in the ``batches`` storage (Django's
storage API: the state dir by default, S3-compatible storage when configured);
the row holds what was checked at upload. A ``Batch`` runs the lines of one
input file through the gateway with the key that created it, and writes its
answers to an output file and an error file. A ``BatchLine`` is one line's
answer, written once (unique per batch and line number) however often a
worker that dies is replaced; the batch's files are assembled from them and
then they are deleted.

Files and batches belong to the team of the key that made them (or to that
key alone, for a key of no team): another team's keys see neither.
"""

import secrets

from django.db import models

from .access import ApiKey
from .choices import BatchStatus, FilePurpose
from .teams import Team


def new_file_id() -> str:
    return f"file-{secrets.token_hex(12)}"


def new_batch_id() -> str:
    return f"batch_{secrets.token_hex(12)}"


class BatchFile(models.Model):
    """A JSONL file of the Batch API: a batch's input (``batch``) or output (``batch_output``)."""

    id = models.CharField(primary_key=True, max_length=40, default=new_file_id, editable=False)
    api_key = models.ForeignKey(
        ApiKey,
        on_delete=models.CASCADE,
        related_name="batch_files",
        help_text="The key that uploaded it (or whose batch wrote it).",
    )
    team = models.ForeignKey(
        Team,
        null=True,
        blank=True,
        on_delete=models.CASCADE,
        related_name="batch_files",
        help_text="Its owner: every key of this team may use it. Empty: only its key.",
    )
    purpose = models.CharField(max_length=16, choices=FilePurpose.choices)
    filename = models.CharField(max_length=255)
    size_bytes = models.PositiveBigIntegerField("size (bytes)")
    lines = models.PositiveIntegerField(default=0, help_text="Requests (lines) it holds.")
    storage_name = models.CharField(
        max_length=255, editable=False, help_text="Its name in the batches storage."
    )
    summary = models.JSONField(
        default=dict,
        blank=True,
        editable=False,
        help_text='Checked at upload: the first line of each URL and model, {"urls": '
        '{url: line}, "models": {model: line}}.',
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [models.Index(fields=["team", "api_key", "-created_at"])]

    def __str__(self) -> str:
        return f"{self.id} ({self.filename})"


class Batch(models.Model):
    """One batch: the lines of ``input_file`` sent through the gateway with ``api_key``.

    Its state changes happen in ``fleet.services.batches.lifecycle``, each a
    conditional update from the states it may leave.
    """

    id = models.CharField(primary_key=True, max_length=40, default=new_batch_id, editable=False)
    api_key = models.ForeignKey(
        ApiKey,
        on_delete=models.CASCADE,
        related_name="batches",
        help_text="The key that created it: its lines go through the gateway as this key, "
        "within its models, limits and budgets.",
    )
    team = models.ForeignKey(
        Team,
        null=True,
        blank=True,
        on_delete=models.CASCADE,
        related_name="batches",
        help_text="Its owner: every key of this team may see and cancel it. Empty: only its key.",
    )
    endpoint = models.CharField(max_length=64)
    completion_window = models.CharField(max_length=8, default="24h")
    metadata = models.JSONField(default=dict, blank=True)
    # A client may delete a finished batch's files and keep the batch, which goes on
    # naming them, as OpenAI's does: hence no database constraint. An unfinished
    # batch's input cannot be deleted (fleet.services.batches.files.delete_file).
    input_file = models.ForeignKey(
        BatchFile, on_delete=models.DO_NOTHING, db_constraint=False, related_name="batches"
    )
    output_file = models.ForeignKey(
        BatchFile,
        null=True,
        blank=True,
        on_delete=models.DO_NOTHING,
        db_constraint=False,
        related_name="+",
    )
    error_file = models.ForeignKey(
        BatchFile,
        null=True,
        blank=True,
        on_delete=models.DO_NOTHING,
        db_constraint=False,
        related_name="+",
    )
    # Observed: where it is.
    status = models.CharField(
        max_length=16, choices=BatchStatus.choices, default=BatchStatus.VALIDATING
    )
    errors = models.JSONField(
        null=True, blank=True, help_text="Why it failed validation: OpenAI's errors list."
    )
    total = models.PositiveIntegerField(default=0, help_text="Lines in its input.")
    completed = models.PositiveIntegerField(default=0, help_text="Lines answered with a 2xx.")
    failed = models.PositiveIntegerField(default=0, help_text="Lines answered with an error.")
    paused = models.CharField(
        max_length=255,
        blank=True,
        help_text="Why no new line is being sent now (interactive requests come first), "
        "as the runner last saw it. Empty: not paused.",
    )
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField(help_text="The end of its completion window.")
    in_progress_at = models.DateTimeField(null=True, blank=True)
    finalizing_at = models.DateTimeField(null=True, blank=True)
    completed_at = models.DateTimeField(null=True, blank=True)
    failed_at = models.DateTimeField(null=True, blank=True)
    expired_at = models.DateTimeField(null=True, blank=True)
    cancelling_at = models.DateTimeField(null=True, blank=True)
    cancelled_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        verbose_name_plural = "batches"
        indexes = [
            models.Index(fields=["status"]),
            models.Index(fields=["team", "api_key", "-created_at"]),
        ]

    def __str__(self) -> str:
        return self.id

    @property
    def answered(self) -> int:
        return self.completed + self.failed


class BatchLine(models.Model):
    """One line's answer, written once: the unique (batch, line) makes a retried write a no-op.

    ``status_code`` and ``body`` are the gateway's answer (its JSON as text);
    a line that got none (the window ended) has an ``error_code`` instead.
    """

    batch = models.ForeignKey(Batch, on_delete=models.CASCADE, related_name="lines")
    line = models.PositiveIntegerField(help_text="Its line number in the input file, from 1.")
    custom_id = models.CharField(max_length=512)
    status_code = models.PositiveSmallIntegerField(null=True, blank=True)
    body = models.TextField(blank=True)
    error_code = models.CharField(max_length=64, blank=True)
    error_message = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["batch", "line"]
        constraints = [
            models.UniqueConstraint(fields=["batch", "line"], name="batch_line_once"),
        ]

    def __str__(self) -> str:
        return f"{self.batch_id} line {self.line}"

    @property
    def ok(self) -> bool:
        return self.status_code is not None and 200 <= self.status_code < 300
