"""Running batches: their lines sent through the gateway, each answer written once.

Beat's ``tick`` checks new batches (``lifecycle.validate``) and names the owners
(a team, or a key of no team) that have batches to run; the task layer hands
each to a worker, which runs ``run_owner`` for one slice (``LLMGW_BATCH_SLICE_S``)
under that owner's lease in Redis (``leases``), so one worker at a time sends an
owner's lines and a worker killed -9 is replaced once its lease runs out.

Each line goes to the gateway as an ordinary HTTP request (``sending``) with the
batch's credential (``credentials``), so it meets the gateway's
routing and the key's models, limits and budgets like any other request. At
most ``LLMGW_BATCH_CONCURRENCY`` lines of a batch and
``LLMGW_BATCH_TEAM_CONCURRENCY`` of an owner are in flight, and no line starts
while its model's interactive requests wait or it has no ready replica
(``pause``). A line refused for a passing reason (a rate limit, no replica, the
gateway away) is sent again later, and its batch starts no other line until then
(the next would hear the same: the whole input is not sent to a gateway that is
away); any other answer is the line's.

Idempotent per line: an answer is written as a ``BatchLine`` row, unique per
batch and line, and a slice starts with the lines that have none. A worker
killed mid-slice loses only what it had in flight, which the next slice sends
again; the first answer written is the one kept, so no line is answered twice
in the output. When every line has its row, the files are assembled
(``lifecycle.finish``).
"""

import json
import logging
import threading
import time
from collections import deque
from collections.abc import Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field

from django.db import transaction
from django.db.models import Count, Q
from django.utils import timezone

from fleet.conf import fleet_settings
from fleet.models import Batch, BatchFile, BatchLine, BatchStatus

from . import credentials, files, leases, lifecycle, pause
from .sending import Answer, Sender, verdict

logger = logging.getLogger(__name__)

S = BatchStatus
# Statuses whose batches a runner holds: lines to send, or files to write.
RUNNING = (S.IN_PROGRESS, S.CANCELLING, S.FINALIZING)
# How often a slice looks again at its batches (a cancel, a new batch) and at what
# interactive traffic is doing.
LOOK_S = 1.0
# Answers written together: at most this many, or after this long.
FLUSH_LINES = 50
FLUSH_S = 0.5


def tick() -> list[str]:
    """Beat's step: check validating batches; the owners whose batches want a worker."""
    for batch in Batch.objects.filter(status=S.VALIDATING).select_related("api_key"):
        lifecycle.validate(batch)
    owners = {
        leases.owner_of(team_id, key_id)
        for team_id, key_id in Batch.objects.filter(status__in=RUNNING)
        .values_list("team_id", "api_key_id")
        .distinct()
    }
    return sorted(o for o in owners if not leases.lease_held(o))


def run_owner(owner: str, slice_s: float | None = None) -> bool:
    """One slice of an owner's batches, if no other worker holds them; whether to go on at
    once (the slice ended with lines still to send)."""
    c = fleet_settings()
    lease = leases.Lease(owner, c.batch_lease_s)
    with lease as held:
        if not held:
            return False
        return Slice(owner, lease.lost).run(slice_s or c.batch_slice_s)


# ---- one slice ------------------------------------------------------------------------


@dataclass
class Item:
    line: int
    custom_id: str
    model: str
    url: str
    body: bytes
    attempts: int = 0


@dataclass
class Running:
    """One batch a slice holds."""

    batch: Batch
    token: str
    source: Iterator[Item] | None = None  # the input's unanswered lines, read lazily
    again: deque = field(default_factory=deque)  # (not before, Item), sent again later
    in_flight: int = 0
    read_all: bool = False
    paused: str = ""  # why its next line may not start now ("" when it may)
    ended: bool = False  # its completion window is over
    # No line of it starts before this (time.monotonic()): the gateway turned one away
    # for now (away, the model busy), and the next would hear the same.
    held_until: float = 0.0

    def next_item(self, now: float) -> Item | None:
        if self.again and self.again[0][0] <= now:
            return self.again.popleft()[1]
        if self.read_all or self.source is None:
            return None
        item = next(self.source, None)
        if item is None:
            self.read_all = True
        return item

    def peek_model(self) -> str | None:
        """The model of the next line to send, without taking it."""
        if self.again:
            return self.again[0][1].model
        if self.read_all or self.source is None:
            return None
        item = next(self.source, None)
        if item is None:
            self.read_all = True
            return None
        self.again.appendleft((0.0, item))
        return item.model

    def could_start(self, now: float) -> bool:
        """Whether a line of it could start now, were it not paused or full."""
        return bool(self.again and self.again[0][0] <= now) or not (
            self.read_all or self.source is None
        )


def _answered_lines(batch: Batch) -> bytearray:
    """A byte per line number, 1 where the line has its answer.

    Not a set of line numbers: held for the whole slice, a set of the lines
    answered grew with the batch (6.9 MiB held, 9.5 MiB at its peak, at
    100,000 lines), and so did the worker's memory from slice to slice. The
    rows are read in chunks rather than as one list, for the same reason.
    """
    done = bytearray(batch.total + 1)
    rows = BatchLine.objects.filter(batch=batch).order_by().values_list("line", flat=True)
    for n in rows.iterator(chunk_size=10_000):
        if n >= len(done):  # past the total: none in a checked file, but kept all the same
            done.extend(bytes(n + 1 - len(done)))
        done[n] = 1
    return done


def _unanswered(batch: Batch) -> Iterator[Item]:
    done = _answered_lines(batch)
    source = BatchFile.objects.filter(pk=batch.input_file_id).first()
    if source is None:
        return
    for n, raw in files.lines(source):
        if (n < len(done) and done[n]) or not raw.strip():
            continue
        request = json.loads(raw)
        body = json.dumps(request["body"], separators=(",", ":")).encode()
        yield Item(n, request["custom_id"], request["body"]["model"], request["url"], body)


class Slice:
    def __init__(self, owner: str, lost: threading.Event):
        c = fleet_settings()
        self.owner = owner
        self.lost = lost
        self.per_batch = c.batch_concurrency
        self.per_owner = c.batch_team_concurrency
        self.retry_s = c.batch_retry_s
        self.sender = Sender(c.batch_gateway_url, c.gateway_total_timeout_s + 10)
        self.batches: dict[str, Running] = {}
        self.buffer: list[BatchLine] = []
        self.flushed_at = time.monotonic()
        self.facts = pause.Facts()
        self.looked_at = 0.0

    def run(self, slice_s: float) -> bool:
        deadline = time.monotonic() + slice_s
        pool = ThreadPoolExecutor(self.per_owner, thread_name_prefix="batch-line")
        in_flight: dict[Future, tuple[Running, Item]] = {}
        sent = 0
        idle = False  # ended early: nothing could start (beat's next tick brings it back)
        try:
            while True:
                now = time.monotonic()
                if now - self.looked_at >= LOOK_S:
                    self._look()
                    self.looked_at = now
                stopping = now >= deadline or self.lost.is_set()
                if not stopping:
                    sent += self._start(pool, in_flight, now)
                if not in_flight:
                    self._flush()
                    self._finish_what_is_done()
                    # Nothing more to send now (all paused, read, or waiting to go again):
                    # the worker goes back to other tasks, and beat's next tick returns.
                    if stopping:
                        break
                    if not self._can_start(time.monotonic()):
                        idle = True
                        break
                done, _ = wait(list(in_flight), timeout=0.2, return_when=FIRST_COMPLETED)
                for fut in done:
                    running, item = in_flight.pop(fut)
                    running.in_flight -= 1
                    self._answered(running, item, fut.result())
                if self.buffer and (
                    len(self.buffer) >= FLUSH_LINES or time.monotonic() - self.flushed_at >= FLUSH_S
                ):
                    self._flush()
                    self._finish_what_is_done()
        finally:
            pool.shutdown(wait=True)
            self._flush()
            for running in self.batches.values():
                if running.source is not None:
                    running.source.close()  # the input file, held open while it was read
        more = any(not r.read_all or r.again for r in self.batches.values())
        logger.info("batch slice owner=%s sent=%d more=%s", self.owner, sent, more)
        return more and sent > 0 and not idle and not self.lost.is_set()

    # -- looking around

    def _look(self) -> None:
        """Batches of this owner now (a new one, a cancel), and what interactive traffic does."""
        now = timezone.now()
        current = {
            b.pk: b
            for b in Batch.objects.filter(leases.owned_by(self.owner), status__in=RUNNING)
            .select_related("api_key")
            .order_by("created_at")
        }
        for pk in list(self.batches):
            if pk not in current:
                del self.batches[pk]
        for pk, batch in current.items():
            running = self.batches.get(pk)
            if running is None:
                token = credentials.mint(batch.api_key.secret_hash, pk)
                running = self.batches[pk] = Running(batch, token)
                # From the rows: a worker that died between writing answers and
                # counting them left the counts behind.
                self._recount(pk)
                if batch.status == S.IN_PROGRESS:
                    running.source = _unanswered(batch)
            else:
                running.batch = batch
            running.ended = batch.expires_at <= now
        self.facts = pause.gather()
        for running in self.batches.values():
            model = running.peek_model() if running.batch.status == S.IN_PROGRESS else None
            why = pause.why_paused(model, self.facts) if model else ""
            if why != running.paused:
                running.paused = why
                Batch.objects.filter(pk=running.batch.pk).update(paused=why)
                if why:
                    logger.info("batch %s paused: %s", running.batch.pk, why)

    def _sendable(self, running: Running, now: float) -> bool:
        return (
            running.batch.status == S.IN_PROGRESS
            and not running.ended
            and not running.paused
            and running.held_until <= now
            and running.in_flight < self.per_batch
        )

    def _can_start(self, now: float) -> bool:
        """Whether any line could start now (not every batch paused, held, read or waiting)."""
        return any(r.could_start(now) for r in self.batches.values() if self._sendable(r, now))

    # -- sending

    def _start(self, pool, in_flight, now: float) -> int:
        started = 0
        progress = True
        while progress and len(in_flight) < self.per_owner:
            progress = False
            # Round robin: one line of each batch in turn, oldest batch first.
            for running in self.batches.values():
                if len(in_flight) >= self.per_owner:
                    break
                if not self._sendable(running, now):
                    continue
                item = running.next_item(now)
                if item is None:
                    continue
                if why := pause.why_paused(item.model, self.facts):
                    running.again.appendleft((0.0, item))
                    running.paused = why
                    continue
                item.attempts += 1
                running.in_flight += 1
                fut = pool.submit(self.sender.send, item.url, running.token, item.body)
                in_flight[fut] = (running, item)
                started += 1
                progress = True
        return started

    def _answered(self, running: Running, item: Item, answer: Answer) -> None:
        delay = verdict(answer, item.attempts, self.retry_s)
        if delay is not None:
            due = time.monotonic() + delay
            running.again.append((due, item))
            running.held_until = max(running.held_until, due)
            return
        body = answer.body.decode("utf-8", "replace")
        status = answer.status
        try:
            json.loads(body)
        except ValueError:
            status, body = (
                502,
                json.dumps(
                    {
                        "error": {
                            "message": "the gateway's answer was not JSON",
                            "type": "upstream_error",
                            "param": None,
                            "code": "upstream_malformed",
                        }
                    }
                ),
            )
        self.buffer.append(
            BatchLine(
                batch_id=running.batch.pk,
                line=item.line,
                custom_id=item.custom_id,
                status_code=status,
                body=body,
            )
        )

    # -- writing

    def _flush(self) -> None:
        """Write the answers gathered: a row per line, once (a line answered before, by a
        worker that died after writing it, keeps its first answer); then the counts."""
        self.flushed_at = time.monotonic()
        if not self.buffer:
            return
        rows, self.buffer = self.buffer, []
        by_batch: dict[str, list[BatchLine]] = {}
        for row in rows:
            by_batch.setdefault(row.batch_id, []).append(row)
        for batch_id, answers in by_batch.items():
            self._write(batch_id, answers)

    def _write(self, batch_id: str, answers: list[BatchLine]) -> None:
        """One batch's answers and its counts, added to by the rows this write adds.

        Counted from the rows it adds rather than recounted from all of the batch's
        rows: a recount reads every row written so far, so a batch's N lines cost
        N²/FLUSH_LINES rows read (2,000 reads a line at 100,000 lines) and its
        runner slowed as the batch grew. Exact all the same: the batch's row is
        locked first (IMMEDIATE on SQLite), so no other writer (a worker whose
        lease ran out, writing what it had in flight) adds a line between the
        look for the lines already there and the insert.
        """
        with transaction.atomic():
            counts = (
                Batch.objects.select_for_update()
                .filter(pk=batch_id, status__in=RUNNING)
                .values_list("completed", "failed")
                .first()
            )
            if counts is None:
                return  # finished (its files written, its rows gone) or deleted meanwhile
            # Bounded by the lines' range as well: with the IN list alone, PostgreSQL
            # scanned every row of the batch through its batch_id index while the
            # table had no statistics yet (a new table, before autovacuum's analyze),
            # a read of the whole batch again on each write. order_by(): BatchLine's
            # default ordering would join the batch's table for nothing.
            lines = [r.line for r in answers]
            there = set(
                BatchLine.objects.filter(
                    batch_id=batch_id, line__gte=min(lines), line__lte=max(lines), line__in=lines
                )
                .order_by()
                .values_list("line", flat=True)
            )
            new = [r for r in answers if r.line not in there]
            BatchLine.objects.bulk_create(new, ignore_conflicts=True)
            ok = sum(r.ok for r in new)
            completed, failed = counts[0] + ok, counts[1] + len(new) - ok
            if new:
                Batch.objects.filter(pk=batch_id).update(completed=completed, failed=failed)
        running = self.batches.get(batch_id)
        if running is not None:
            running.batch.completed, running.batch.failed = completed, failed

    def _recount(self, batch_id: str) -> None:
        counts = BatchLine.objects.filter(batch_id=batch_id).aggregate(
            ok=Count("pk", filter=Q(status_code__gte=200, status_code__lt=300)),
            all=Count("pk"),
        )
        completed, failed = counts["ok"], counts["all"] - counts["ok"]
        Batch.objects.filter(pk=batch_id).update(completed=completed, failed=failed)
        running = self.batches.get(batch_id)
        if running is not None:
            running.batch.completed, running.batch.failed = completed, failed

    def _finish_what_is_done(self) -> None:
        for pk, running in list(self.batches.items()):
            batch = running.batch
            outcome = lifecycle.next_step(
                batch.status,
                total=batch.total,
                answered=batch.answered,
                in_flight=running.in_flight,
                ended=running.ended,
            )
            if outcome is None:
                continue
            if lifecycle.finish(batch, outcome):
                logger.info(
                    "batch %s %s completed=%d failed=%d",
                    pk,
                    outcome,
                    batch.completed,
                    batch.failed,
                )
            del self.batches[pk]
