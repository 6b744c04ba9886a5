"""The writer thread: every write to the file, off the event loop, one transaction a batch.

Why one thread: SQLite has one writer per file, and a commit waits for the disk. The event
loop queues a write and goes on; the thread commits whatever is queued together (a response
as started and as ended often land in one transaction). A write that fails (disk full, locked
past the busy timeout, corrupt) warns once and stays queued to retry; a read-only file drops
it (the response lives on in memory). Until a write is committed, ``pending`` has it: readers
must not miss a response that is queued, nor find one whose delete is queued.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import sqlite3
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nbresponses.service.storage.errors import is_read_only
from nbresponses.service.storage.retention import Retention, hide
from nbresponses.service.storage.schema import COLUMNS, UPSERT, Row

log = logging.getLogger(__name__)

MAX_RETRY = 1000  # failed writes kept to retry; older ones then live on in the memory store only


@dataclass
class Write:
    """One queued write: a row to upsert (``build()`` runs in the writer thread), a delete,
    retention, or a ``task`` on the writer's connection; ``done`` is set once it ran."""

    key: str
    build: Callable[[], Row | None] | None = None
    record: Any = None  # what the row is built from: readers take it while the write is queued
    delete: bool = False
    retention: bool = False
    task: Callable[[sqlite3.Connection], Any] | None = None  # run on the writer's connection
    result: Any = None
    done: threading.Event = field(default_factory=threading.Event)


class Writer:
    """The queue, the thread and its connection; what is queued or failed, by response id."""

    def __init__(
        self,
        db: sqlite3.Connection,
        path: Path,
        retention: Retention,
        warn: Callable[[str, str], None],
    ) -> None:
        self.db = db  # used by the thread only, once it started
        self.path = path
        self.retention = retention
        self.writable = True
        self.error: str | None = None  # the last write failure, until a write succeeds
        self.written = 0
        self.write_seconds = 0.0  # time the writer spent in transactions
        self._warn = warn
        self._pending: dict[str, Write] = {}  # queued or failed, by response id, for reads
        self._pending_lock = threading.Lock()
        self._queue: queue.Queue[Write | None] = queue.Queue()
        self._thread = threading.Thread(target=self._loop, name="nbr-store", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def put(self, op: Write) -> None:
        """Queue ``op``; a write or a delete (``key``: a response id) is in ``pending``
        until it is written (or given up)."""
        if op.key:
            with self._pending_lock:
                self._pending[op.key] = op
        self._queue.put(op)

    def pending(self, response_id: str) -> Write | None:
        with self._pending_lock:
            return self._pending.get(response_id)

    def count_pending(self) -> int:
        with self._pending_lock:
            return len(self._pending)

    def stop(self) -> None:
        """Write what is queued, then end the thread."""
        if self._thread.is_alive():
            self._queue.put(None)
            self._thread.join(timeout=30)

    def read_only(self, exc: Exception) -> None:
        self.writable = False
        self._warn("readonly", f"{self.path} is read-only ({exc}): new responses stay in memory.")

    def _loop(self) -> None:
        retry: list[Write] = []
        closing = False
        while not closing:
            try:
                first: Write | None = self._queue.get(timeout=1.0 if retry else None)
            except queue.Empty:
                first = Write("")  # nothing new: retry the failed writes
            batch = [first]
            while first is not None:  # take what else is queued, up to a close
                try:
                    first = self._queue.get_nowait()
                except queue.Empty:
                    break
                batch.append(first)
            closing = None in batch
            retry = self._commit([*retry, *(op for op in batch if op is not None)])
        if retry:
            self._warn("lost", f"{self.path}: {len(retry)} responses were not written at close.")
        self.db.close()

    def _commit(self, batch: list[Write]) -> list[Write]:
        """Write a batch in one transaction; the writes to retry (all of them on failure)."""
        writes = [op for op in batch if op.key]
        failed: list[Write] = []
        if writes and self.writable:
            started = time.perf_counter()
            try:
                self._transaction(writes)
            except sqlite3.Error as exc:
                self._failed(exc)
                failed = writes
            else:
                self.written += sum(1 for op in writes if not op.delete)
                self.write_seconds += time.perf_counter() - started
                self.error = None
        if not failed and (any(op.retention for op in batch) or self.retention.due()):
            self.retention.run(self.db)
        for op in batch:
            if op.task is not None:
                try:
                    op.result = op.task(self.db)
                except Exception as exc:  # handed back to the caller of in_writer
                    op.result = exc
        retry = self._settle(writes, failed)
        for op in batch:
            op.done.set()  # a flush after a failure reports it; the write is retried
        return retry

    def _settle(self, writes: list[Write], failed: list[Write]) -> list[Write]:
        """Drop what was written from ``pending``; the failed writes to retry (unless newer
        ones of the same responses replaced them, or the file turned read-only)."""
        with self._pending_lock:
            for op in writes:
                if op not in failed and self._pending.get(op.key) is op:
                    del self._pending[op.key]
            retry = [op for op in failed if self._pending.get(op.key) is op]
            if not self.writable:  # read-only: they live on in the memory store only
                for op in retry:
                    del self._pending[op.key]
                retry = []
            for op in retry[: max(0, len(retry) - MAX_RETRY)]:
                del self._pending[op.key]  # still failing: the oldest live on in memory only
            return retry[-MAX_RETRY:]

    def _transaction(self, writes: list[Write]) -> None:
        db = self.db
        rows: list[tuple[Write, Row | None]] = []
        for op in writes:  # build first: a bad row fails itself, not the batch
            try:
                rows.append((op, None if op.delete or op.build is None else op.build()))
            except Exception as exc:  # a response that cannot be serialized is a bug; say so
                log.exception("response %s could not be stored", op.key)
                self._warn(f"build:{type(exc).__name__}", f"a response could not be stored: {exc}")
                rows.append((op, None))
        db.execute("BEGIN IMMEDIATE")
        try:
            for op, row in rows:
                if op.delete:
                    hide(db, [op.key])
                elif row is not None:
                    db.execute(UPSERT, [row.get(c) for c in COLUMNS])
            db.execute("COMMIT")
        except BaseException:
            with contextlib.suppress(sqlite3.Error):
                db.execute("ROLLBACK")
            raise

    def _failed(self, exc: sqlite3.Error) -> None:
        text = str(exc)
        self.error = text
        if is_read_only(exc):
            self.read_only(exc)
            return
        kind = "full" if "full" in text else "locked" if "locked" in text else "write"
        self._warn(
            kind,
            f"{self.path}: responses could not be written ({text}); they stay in memory and "
            "the write is retried.",
        )
