"""The Batches page: the newest batches an operator may see, each with its progress; one
batch's page with its metadata, errors and the lines that failed so far.

Who sees which batch is ``batches.owners.seen_by`` (the teams they are in; all of them
with ``fleet.manage_all_teams``). The list is the newest ``BATCHES_SHOWN`` of them in
three queries whatever their number (tests/console/test_batches.py counts them).
"""

from dataclasses import dataclass, field
from datetime import datetime

from django.db.models import Q
from django.utils import timezone

from fleet.models import BATCH_FINISHED, Batch, BatchFile, BatchLine, BatchStatus

from ..batches.owners import seen_by

# Batches listed, newest first; the rest are counted and left to the admin's list.
BATCHES_SHOWN = 200
# Lines that failed so far, shown on a running batch's page (its error file has them all).
FAILED_LINES_SHOWN = 20
UNFINISHED = "unfinished"
# What the status filter offers: every status, and those still running.
STATUS_FILTERS = (UNFINISHED, *BatchStatus.values)
# When each status began (a batch's page lists those it passed, in time order).
STEPS = (
    ("created", "created_at"),
    ("in progress", "in_progress_at"),
    ("finalizing", "finalizing_at"),
    ("cancelling", "cancelling_at"),
    ("completed", "completed_at"),
    ("failed", "failed_at"),
    ("expired", "expired_at"),
    ("cancelled", "cancelled_at"),
)


def progress_text(total: int, completed: int, failed: int) -> str:
    """'15 of 20 answered (1 failed)': the console's and the admin's words."""
    return f"{completed + failed} of {total} answered" + (f" ({failed} failed)" if failed else "")


@dataclass
class Progress:
    """Lines answered out of a batch's total: a bar with its 2xx and its failed parts."""

    total: int
    completed: int
    failed: int

    @property
    def text(self) -> str:
        return progress_text(self.total, self.completed, self.failed)

    def _share(self, n: int) -> float:
        return 100.0 * min(n, self.total) / self.total if self.total else 0.0

    @property
    def percent(self) -> str:
        """Answered, as a whole percentage ("" for a batch of no lines)."""
        return f"{self._share(self.completed + self.failed):.0f}" if self.total else ""

    @property
    def completed_width(self) -> str:
        return f"{self._share(self.completed):.1f}"

    @property
    def failed_width(self) -> str:
        return f"{min(self._share(self.failed), 100.0 - self._share(self.completed)):.1f}"


@dataclass
class BatchRow:
    id: str
    owner: str  # "team research" or "key nightly-evals"
    endpoint: str
    models: list[str] | None  # from its input file's summary; None: that file was deleted
    status: str
    status_text: str
    progress: Progress
    paused: str
    created_at: datetime
    expires_at: datetime
    ended_at: datetime | None  # when it reached the status it is in, if that is an end
    input_file_id: str
    output_file_id: str | None
    error_file_id: str | None
    finished: bool


@dataclass
class BatchList:
    rows: list[BatchRow]
    count: int  # all the batches the filter matches, of which ``rows`` are the newest
    status: str
    query: str
    at: datetime = field(default_factory=timezone.now)


@dataclass
class BatchDetail:
    row: BatchRow
    batch: Batch
    api_key: str  # the key's name and prefix
    steps: list[tuple[str, datetime]]  # (status, since), in order
    errors: list[dict]  # validation's, OpenAI's shape: code, message, param, line
    failed_lines: list[BatchLine]  # the latest that failed, while the batch runs
    failed_lines_total: int
    at: datetime = field(default_factory=timezone.now)


def owner_text(obj) -> str:
    """Whose a batch or batch file is: "team research", or "key nightly" for a key of none."""
    return f"team {obj.team.name}" if obj.team_id else f"key {obj.api_key.name}"


def _ended_at(batch: Batch) -> datetime | None:
    if batch.status not in BATCH_FINISHED:
        return None
    return getattr(batch, f"{batch.status}_at", None)


def _models(batches: list[Batch]) -> dict[str, list[str]]:
    """Input file id -> the models its lines name, sorted: one query."""
    ids = {b.input_file_id for b in batches}
    found = BatchFile.objects.filter(pk__in=ids).values_list("pk", "summary")
    return {pk: sorted((summary or {}).get("models", {})) for pk, summary in found}


def _row(batch: Batch, models: dict[str, list[str]]) -> BatchRow:
    return BatchRow(
        id=batch.id,
        owner=owner_text(batch),
        endpoint=batch.endpoint,
        models=models.get(batch.input_file_id),
        status=batch.status,
        status_text=batch.get_status_display(),
        progress=Progress(batch.total, batch.completed, batch.failed),
        paused=batch.paused if batch.status not in BATCH_FINISHED else "",
        created_at=batch.created_at,
        expires_at=batch.expires_at,
        ended_at=_ended_at(batch),
        input_file_id=batch.input_file_id,
        output_file_id=batch.output_file_id,
        error_file_id=batch.error_file_id,
        finished=batch.status in BATCH_FINISHED,
    )


def visible(user):
    """The batches ``user`` may see, with what a row shows of their owners."""
    return seen_by(Batch.objects.select_related("team", "api_key"), user)


def batch_list(user, *, status: str = "", q: str = "") -> BatchList:
    """The newest ``BATCHES_SHOWN`` batches ``user`` may see, filtered by ``status`` (one of
    STATUS_FILTERS) and ``q`` (part of a batch's id, its key's name or its team's): three
    queries."""
    where = Q()
    if status == UNFINISHED:
        where &= ~Q(status__in=BATCH_FINISHED)
    elif status in BatchStatus.values:
        where &= Q(status=status)
    else:
        status = ""
    q = q.strip()[:100]
    if q:
        where &= Q(id__icontains=q) | Q(api_key__name__icontains=q) | Q(team__name__icontains=q)
    batches = visible(user).filter(where).order_by("-created_at", "-id")
    count = batches.count()
    rows = list(batches[:BATCHES_SHOWN])
    models = _models(rows) if rows else {}
    return BatchList([_row(b, models) for b in rows], count, status, q)


def batch_detail(user, batch_id: str) -> BatchDetail:
    """One batch ``user`` may see; Batch.DoesNotExist for one they may not, as for none."""
    batch = visible(user).get(pk=batch_id)
    failed = (
        BatchLine.objects.filter(batch=batch)
        .exclude(status_code__gte=200, status_code__lt=300)
        .order_by("-line")
    )
    lines = list(failed[:FAILED_LINES_SHOWN])
    return BatchDetail(
        row=_row(batch, _models([batch])),
        batch=batch,
        api_key=f"{batch.api_key.name} ({batch.api_key.prefix}…)",
        steps=sorted(
            ((name, at) for name, f in STEPS if (at := getattr(batch, f)) is not None),
            key=lambda step: step[1],
        ),
        errors=list((batch.errors or {}).get("data") or []),
        failed_lines=lines,
        failed_lines_total=failed.count() if len(lines) == FAILED_LINES_SHOWN else len(lines),
    )
