"""A batch's life: created, checked, run, finished; each step a guarded conditional update.

::

    validating ─▶ in_progress ─▶ finalizing ─▶ completed
        │   │         │   │                 └▶ expired   (its window ended first)
        │   │         │   └──────────────────▶ (expired, through finalizing)
        │   └─────────┴─▶ cancelling ─▶ cancelled
        └─▶ failed   (its input named a model the key may not use, or none that exists)

``move`` is the one place a status changes: ``filter(pk=…, status__in=<the states it
may come from>).update(…)``, whose row count says whether it happened, so two
workers (or a worker and a client's cancel) never both move a batch. The rules
(``MAY_COME_FROM``, ``next_step``) are pure, and tested as tables.
"""

import hashlib
import json
import logging
from datetime import datetime, timedelta

from django.db import transaction
from django.utils import timezone

from fleet.models import Adapter, Batch, BatchFile, BatchLine, BatchStatus, Model

from . import files
from .jsonl import ENDPOINTS

logger = logging.getLogger(__name__)

S = BatchStatus
WINDOWS = {"24h": timedelta(hours=24)}
METADATA_MAX = 16

# Each status, and the statuses a batch may reach it from.
MAY_COME_FROM: dict[str, tuple[str, ...]] = {
    S.IN_PROGRESS: (S.VALIDATING,),
    S.FAILED: (S.VALIDATING,),
    S.CANCELLING: (S.VALIDATING, S.IN_PROGRESS),
    S.FINALIZING: (S.IN_PROGRESS,),
    S.COMPLETED: (S.FINALIZING,),
    S.EXPIRED: (S.FINALIZING,),
    S.CANCELLED: (S.CANCELLING,),
}


class BatchRefused(ValueError):
    """A batch that cannot be created or changed as asked; ``param`` names the field."""

    def __init__(self, message: str, param: str | None = None, status: int = 400):
        super().__init__(message)
        self.param = param
        self.status = status


def may_move(src: str, dst: str) -> bool:
    return src in MAY_COME_FROM.get(dst, ())


def move(batch_id: str, dst: str, **fields) -> bool:
    """``batch_id`` to ``dst`` if it is in a status that may reach it; whether it moved."""
    stamp = f"{dst}_at"
    if any(f.name == stamp for f in Batch._meta.concrete_fields):
        fields.setdefault(stamp, timezone.now())
    moved = Batch.objects.filter(pk=batch_id, status__in=MAY_COME_FROM[dst]).update(
        status=dst, **fields
    )
    if moved:
        logger.info("batch %s status=%s", batch_id, dst)
    return bool(moved)


def next_step(status: str, *, total: int, answered: int, in_flight: int, ended: bool) -> str | None:
    """What a runner does with a batch it holds: the status to finish it in, or None to
    keep sending. Lines in flight are waited for first: their answers are written once
    they come, and a file written before them would miss them."""
    if status == S.CANCELLING:
        return S.CANCELLED if in_flight == 0 else None
    if status not in (S.IN_PROGRESS, S.FINALIZING):
        return None
    if answered >= total:
        return S.COMPLETED
    if ended or status == S.FINALIZING:
        return S.EXPIRED if in_flight == 0 else None
    return None


# ---- the API's doors ------------------------------------------------------------------


def create(key, *, input_file_id, endpoint, completion_window, metadata=None) -> Batch:
    """A new batch of ``key``'s, validating; BatchRefused names what is wrong."""
    from .owners import owned

    if not isinstance(endpoint, str) or endpoint not in ENDPOINTS:
        raise BatchRefused(
            f"'endpoint' must be one of {', '.join(ENDPOINTS)}, not {endpoint!r}", "endpoint"
        )
    window = WINDOWS.get(completion_window) if isinstance(completion_window, str) else None
    if window is None:
        raise BatchRefused(
            f"'completion_window' must be \"24h\", not {completion_window!r}", "completion_window"
        )
    metadata = _metadata(metadata)
    if not isinstance(input_file_id, str) or not input_file_id:
        raise BatchRefused("'input_file_id' must name an uploaded file", "input_file_id")
    source = owned(BatchFile.objects, key).filter(pk=input_file_id).first()
    if source is None:
        raise BatchRefused(f"file {input_file_id} does not exist", "input_file_id", status=404)
    if source.purpose != "batch":
        raise BatchRefused(
            f"file {source.id} has purpose '{source.purpose}'; a batch reads a file uploaded "
            "with purpose 'batch'",
            "input_file_id",
        )
    for url, line in sorted((source.summary or {}).get("urls", {}).items(), key=lambda u: u[1]):
        if url != endpoint:
            raise BatchRefused(
                f"line {line} of file {source.id} is for {url}; every line of a batch for "
                f"{endpoint} must be for {endpoint}",
                "endpoint",
            )
    batch = Batch.objects.create(
        api_key=key,
        team_id=key.team_id,
        endpoint=endpoint,
        completion_window=completion_window,
        metadata=metadata,
        input_file=source,
        total=source.lines,
        expires_at=timezone.now() + window,
    )
    logger.info(
        "batch created id=%s key=%s file=%s lines=%d", batch.id, key.prefix, source.id, batch.total
    )
    return batch


def _metadata(metadata) -> dict:
    if metadata is None:
        return {}
    if not isinstance(metadata, dict) or len(metadata) > METADATA_MAX:
        raise BatchRefused(
            f"'metadata' must be an object of at most {METADATA_MAX} pairs", "metadata"
        )
    for k, v in metadata.items():
        if len(k) > 64 or not isinstance(v, str) or len(v) > 512:
            raise BatchRefused(
                "'metadata' keys are at most 64 characters, its values strings of at most 512",
                "metadata",
            )
    return metadata


def cancel(batch: Batch) -> Batch:
    """Ask a batch to stop: no new line starts, those in flight finish, then it is cancelled
    with what was answered. Cancelling a batch that is cancelling already changes nothing."""
    if batch.status != S.CANCELLING and not move(batch.pk, S.CANCELLING):
        batch.refresh_from_db()
        if batch.status != S.CANCELLING:
            raise BatchRefused(
                f"batch {batch.id} is {batch.status}; only a validating or in-progress batch "
                "can be cancelled",
                status=409,
            )
    batch.refresh_from_db()
    return batch


# ---- the runner's steps ---------------------------------------------------------------


def validate(batch: Batch) -> bool:
    """validating → in_progress, or failed with the lines at fault; whether it may run."""
    key = batch.api_key
    problems = []
    source = BatchFile.objects.filter(pk=batch.input_file_id).first()
    if source is None:
        problems.append(
            {"code": "file_not_found", "message": f"input file {batch.input_file_id} was deleted"}
        )
    else:
        named = (source.summary or {}).get("models", {})
        known = set(Model.objects.filter(name__in=named).values_list("name", flat=True))
        known |= set(Adapter.objects.filter(name__in=named).values_list("name", flat=True))
        allowed = set(key.allowed_models or [])
        for model, line in sorted(named.items(), key=lambda m: m[1]):
            if allowed and model not in allowed:
                problems.append(
                    {
                        "code": "model_not_allowed",
                        "message": f"API key '{key.name}' may not use model '{model}'",
                        "param": "body.model",
                        "line": line,
                    }
                )
            elif model not in known:
                problems.append(
                    {
                        "code": "model_not_found",
                        "message": f"model '{model}' does not exist",
                        "param": "body.model",
                        "line": line,
                    }
                )
    if problems:
        move(batch.pk, S.FAILED, errors={"object": "list", "data": problems})
        return False
    return move(batch.pk, S.IN_PROGRESS)


def line_id(batch_id: str, line: int) -> str:
    return "batch_req_" + hashlib.sha256(f"{batch_id}:{line}".encode()).hexdigest()[:24]


def _output_line(batch_id: str, row: BatchLine) -> bytes:
    rid = line_id(batch_id, row.line)
    custom_id = json.dumps(row.custom_id)
    if row.status_code is None:
        error = json.dumps({"code": row.error_code, "message": row.error_message})
        return (
            f'{{"id":"{rid}","custom_id":{custom_id},"response":null,"error":{error}}}\n'.encode()
        )
    # The body is the gateway's JSON, checked when it came: put in as it is.
    return (
        f'{{"id":"{rid}","custom_id":{custom_id},"response":{{"status_code":{row.status_code},'
        f'"request_id":"{rid}","body":{row.body}}},"error":null}}\n'
    ).encode()


def _expired_lines(batch: Batch, answered: set[int]):
    """Error lines for what the window left unsent, read from the input for their custom_ids."""
    source = BatchFile.objects.filter(pk=batch.input_file_id).first()
    if source is None:
        return
    message = "This request could not be executed before the completion window expired."
    for n, raw in files.lines(source):
        if n in answered or not raw.strip():
            continue
        custom_id = json.loads(raw).get("custom_id")
        row = BatchLine(line=n, custom_id=custom_id, error_code="batch_expired")
        row.error_message = message
        yield _output_line(batch.id, row)


def finish(batch: Batch, outcome: str, now: datetime | None = None) -> bool:
    """Write the batch's output and error files and end it in ``outcome`` (completed,
    expired or cancelled). Safe to repeat after a crash at any point: the files have
    fixed ids (``files.write_output``) and each status moves once."""
    if outcome in (S.COMPLETED, S.EXPIRED):
        move(batch.pk, S.FINALIZING)
        expected = S.FINALIZING
    else:
        expected = S.CANCELLING
    batch.refresh_from_db()
    if batch.status != expected:
        return False
    rows = BatchLine.objects.filter(batch=batch).order_by("line")
    ok = rows.filter(status_code__gte=200, status_code__lt=300)
    bad = rows.exclude(pk__in=ok.values("pk"))

    output = files.write_output(
        batch, "output", (_output_line(batch.id, r) for r in ok.iterator(chunk_size=1000))
    )

    def errors():
        yield from (_output_line(batch.id, r) for r in bad.iterator(chunk_size=1000))
        if outcome == S.EXPIRED:
            answered = set(rows.values_list("line", flat=True))
            yield from _expired_lines(batch, answered)

    error = files.write_output(batch, "error", errors())
    completed = ok.count()
    failed = bad.count() + (batch.total - rows.count() if outcome == S.EXPIRED else 0)
    with transaction.atomic():
        if not move(
            batch.pk,
            outcome,
            output_file_id=output.pk if output else None,
            error_file_id=error.pk if error else None,
            completed=completed,
            failed=failed,
            paused="",
        ):
            return False
        # The answers are in the files now; the rows were only there to write each once.
        BatchLine.objects.filter(batch=batch).delete()
    return True


# ---- how the API shows them -----------------------------------------------------------


def _ts(when: datetime | None) -> int | None:
    return int(when.timestamp()) if when else None


def as_openai(batch: Batch) -> dict:
    """The batch as OpenAI's API shows one."""
    return {
        "id": batch.id,
        "object": "batch",
        "endpoint": batch.endpoint,
        "errors": batch.errors,
        "input_file_id": batch.input_file_id,
        "completion_window": batch.completion_window,
        "status": batch.status,
        "output_file_id": batch.output_file_id,
        "error_file_id": batch.error_file_id,
        "created_at": _ts(batch.created_at),
        "in_progress_at": _ts(batch.in_progress_at),
        "expires_at": _ts(batch.expires_at),
        "finalizing_at": _ts(batch.finalizing_at),
        "completed_at": _ts(batch.completed_at),
        "failed_at": _ts(batch.failed_at),
        "expired_at": _ts(batch.expired_at),
        "cancelling_at": _ts(batch.cancelling_at),
        "cancelled_at": _ts(batch.cancelled_at),
        "request_counts": {
            "total": batch.total,
            "completed": batch.completed,
            "failed": batch.failed,
        },
        "metadata": batch.metadata or None,
    }


def file_as_openai(row: BatchFile) -> dict:
    return {
        "id": row.id,
        "object": "file",
        "bytes": row.size_bytes,
        "created_at": _ts(row.created_at),
        "filename": row.filename,
        "purpose": row.purpose,
        "status": "processed",
        "expires_at": None,
        "status_details": None,
    }
