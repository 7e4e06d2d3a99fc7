"""Batch files in the ``batches`` storage: kept, read, written and deleted through Django's
storage API, so the filesystem under the state dir and S3-compatible storage
(django-storages) are one code path (settings ``LLMGW_BATCH_STORAGE_*``).

A row is written after its file is stored, and a file is deleted after its row
is gone (on commit): a crash between the two leaves at most an orphan file in
the storage, never a row without its file.
"""

import hashlib
import logging
import tempfile
from collections.abc import Iterable, Iterator

from django.core.files import File
from django.core.files.storage import storages
from django.db import transaction

from fleet.models import BATCH_FINISHED, Batch, BatchFile, FilePurpose

from .jsonl import Checked

logger = logging.getLogger(__name__)

# Output written in memory up to this, then in a temporary file.
_SPOOL_BYTES = 8 << 20


class FileInUse(ValueError):
    """A file an unfinished batch still reads."""


def storage():
    return storages["batches"]


def store_input(key, upload, filename: str, checked: Checked) -> BatchFile:
    """Keep a checked upload (a Django File) as ``key``'s batch input file."""
    row = BatchFile(
        api_key=key,
        team_id=key.team_id,
        purpose=FilePurpose.BATCH,
        filename=filename[:255] or "batch.jsonl",
        size_bytes=upload.size,
        lines=checked.lines,
        summary=checked.summary(),
    )
    upload.seek(0)
    row.storage_name = storage().save(f"{row.id}.jsonl", upload)
    try:
        row.save(force_insert=True)
    except Exception:
        storage().delete(row.storage_name)
        raise
    logger.info(
        "batch file stored id=%s key=%s bytes=%d lines=%d",
        row.id,
        key.prefix,
        row.size_bytes,
        row.lines,
    )
    return row


def open_file(row: BatchFile):
    """The file's bytes, as a binary file object (the caller closes it)."""
    return storage().open(row.storage_name, "rb")


def lines(row: BatchFile) -> Iterator[tuple[int, bytes]]:
    """(line number from 1, the line without its newline), in order."""
    with open_file(row) as fh:
        for n, raw in enumerate(fh, start=1):
            yield n, raw.rstrip(b"\r\n")


def output_id(batch_id: str, kind: str) -> str:
    """The id of a batch's output or error file: the same on every try, so a retried
    finalisation finds the file it wrote rather than writing a second."""
    return "file-" + hashlib.sha256(f"{batch_id}:{kind}".encode()).hexdigest()[:24]


def write_output(batch: Batch, kind: str, chunks: Iterable[bytes]) -> BatchFile | None:
    """A batch's ``output`` or ``error`` file from ``chunks``; None when there is nothing
    to write. Written once: a second call returns the first one's row."""
    file_id = output_id(batch.id, kind)
    found = BatchFile.objects.filter(pk=file_id).first()
    if found is not None:
        return found
    with tempfile.SpooledTemporaryFile(_SPOOL_BYTES) as tmp:
        lines = 0
        for chunk in chunks:
            tmp.write(chunk)
            lines += 1
        if not lines:
            return None
        size = tmp.tell()
        tmp.seek(0)
        name = f"{file_id}.jsonl"
        store = storage()
        if store.exists(name):  # left by a finalisation that died before its row
            store.delete(name)
        stored = store.save(name, File(tmp, name=name))
    row = BatchFile(
        id=file_id,
        api_key_id=batch.api_key_id,
        team_id=batch.team_id,
        purpose=FilePurpose.BATCH_OUTPUT,
        filename=f"{batch.id}_{kind}.jsonl",
        size_bytes=size,
        lines=lines,
        storage_name=stored,
    )
    row.save(force_insert=True)
    return row


def delete_file(row: BatchFile) -> None:
    """Delete a file; FileInUse while an unfinished batch reads it."""
    busy = (
        Batch.objects.filter(input_file=row)
        .exclude(status__in=BATCH_FINISHED)
        .values_list("pk", "status")
        .first()
    )
    if busy is not None:
        raise FileInUse(
            f"file {row.id} is the input of batch {busy[0]}, which is {busy[1]}; cancel it "
            "or wait for it to finish first"
        )
    name, file_id = row.storage_name, row.pk
    with transaction.atomic():
        # Finished batches keep naming it, as OpenAI's do.
        row.delete()
        transaction.on_commit(lambda: _delete_stored(name))
    logger.info("batch file deleted id=%s", file_id)


def _delete_stored(name: str) -> None:
    try:
        storage().delete(name)
    except Exception:  # noqa: BLE001 - an orphan in the storage, not a failed delete
        logger.warning("could not delete batch file %s from the storage", name, exc_info=True)
