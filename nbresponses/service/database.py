"""Stored responses on disk: one SQLite file that outlives the kernel, shared by processes.

Why SQLite (the standard library's ``sqlite3``): one file in the user's data dir, safe for a
notebook and a ``nbresponses serve`` on the same machine (WAL: readers never wait for the
writer, writers queue on a busy timeout), FTS5 for searching the history, nothing to install.

``ResponseDatabase`` is what the store, the history, the client and the server see; it
composes the jobs of ``service/storage/`` (schema, writer thread, crash recovery, retention,
reads), whose docstring follows a record from the store to the disk and back. A file that
cannot be used leaves responses in memory (``StoreWarning``) and is never touched.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import sqlite3
import warnings
import weakref
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from nbresponses.service.storage.errors import StoreError, StoreWarning, Warner
from nbresponses.service.storage.reads import Reader
from nbresponses.service.storage.recovery import Owners, cut_off
from nbresponses.service.storage.retention import Retention
from nbresponses.service.storage.schema import RUNNING, Row, connect, dumps, migrate
from nbresponses.service.storage.writer import Write, Writer

__all__ = [
    "FILE_NAME",
    "RUNNING",
    "STORE_ENV",
    "ResponseDatabase",
    "Row",
    "StoreError",
    "StorePath",
    "StoreWarning",
    "default_path",
    "dumps",
    "open_database",
]

StorePath = str | os.PathLike[str] | None  # a file, None (the default file), "memory", "off"
STORE_ENV = "NBRESPONSES_STORE"  # the default for store_path=None: a file, "memory" or "off"
FILE_NAME = "responses.sqlite3"
_OPEN: weakref.WeakSet[ResponseDatabase] = weakref.WeakSet()  # written out at exit


def default_path() -> Path:
    """Where responses are kept by default: ``$NBRESPONSES_STORE``, else the user data dir."""
    import platformdirs

    return Path(platformdirs.user_data_dir("nbresponses", appauthor=False)) / FILE_NAME


def open_database(
    store_path: StorePath,
    *,
    keep_days: float | None = None,
    max_disk_bytes: int | None = None,
) -> ResponseDatabase | None:
    """The database for ``store_path``; None for "memory" and "off" (nothing on disk), or
    when the file cannot be used (a ``StoreWarning`` says why; the file is left untouched)."""
    if store_path is None:
        store_path = os.environ.get(STORE_ENV) or default_path()
    if isinstance(store_path, str) and store_path in ("memory", "off"):
        return None
    try:
        return ResponseDatabase(store_path, keep_days=keep_days, max_disk_bytes=max_disk_bytes)
    except (StoreError, OSError) as exc:
        warnings.warn(f"Responses are kept in memory only: {exc}", StoreWarning, stacklevel=3)
        return None


@atexit.register
def _close_all() -> None:
    for database in list(_OPEN):
        database.close()


class ResponseDatabase:
    """The SQLite file of stored responses: a writer thread for writes, a locked connection
    for reads (any thread)."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        keep_days: float | None = None,
        max_disk_bytes: int | None = None,
        busy_timeout: float = 5.0,
    ) -> None:
        self.path = Path(path).expanduser()
        self.closed = False  # after close(): its store answers from memory only
        warn = Warner()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._reader = Reader(connect(self.path, busy_timeout), self.path, warn)
        refused = migrate(self._reader.db, self.path)
        retention = Retention(self.path, keep_days, max_disk_bytes, warn)
        self._writer = Writer(connect(self.path, busy_timeout), self.path, retention, warn)
        if refused is not None:
            self._writer.read_only(refused)
        self._owners = Owners(self.path)
        self.owner = self._owners.owner
        self._owners.hold()
        self._writer.start()
        _OPEN.add(self)
        self.recover()
        self.apply_retention()

    @property
    def writable(self) -> bool:
        return self._writer.writable

    # -- writes (the writer thread) ----------------------------------------------------

    def write(self, response_id: str, build: Callable[[], Row | None], record: Any = None) -> None:
        """Queue an upsert of a response's row; ``build`` runs in the writer thread, and
        ``record`` (what it is built from) is what ``pending`` hands to readers meanwhile."""
        self._writer.put(Write(response_id, build=build, record=record))

    def delete(self, response_id: str) -> None:
        self._writer.put(Write(response_id, delete=True))

    def pending(self, response_id: str) -> Write | None:
        """A queued (or failed, to retry) write of this response: readers must not miss it."""
        return self._writer.pending(response_id)

    def in_writer(self, task: Callable[[sqlite3.Connection], Any], timeout: float = 30.0) -> Any:
        """Run ``task(connection)`` in the writer thread, after what is queued; its result.
        (Per-connection settings, maintenance; the tests set limits with it.)"""
        op = Write("", task=task)
        self._writer.put(op)
        if not op.done.wait(timeout):
            raise TimeoutError("the store's writer did not answer")
        if isinstance(op.result, BaseException):
            raise op.result
        return op.result

    def flush(self, timeout: float | None = 30.0) -> bool:
        """Wait until everything queued so far is written (or failed); True if it was written."""
        marker = Write("")
        self._writer.put(marker)
        return marker.done.wait(timeout) and not self._writer.count_pending()

    def apply_retention(self) -> None:
        """Forget responses older than ``keep_days`` and the oldest past ``max_disk_bytes``
        (in the writer, after what is queued; it also runs every minute of writing)."""
        self._writer.put(Write("", retention=True))

    def close(self) -> None:
        """Write what is queued, stop the writer, release the owner lock."""
        _OPEN.discard(self)
        self.closed = True
        self._writer.stop()
        with contextlib.suppress(Exception):
            self._reader.close()
        self._owners.release()

    # -- crash recovery ----------------------------------------------------------------

    def recover(self) -> int:
        """Mark running rows whose process is gone as failed; the number marked."""
        dead = self._owners.dead(self._reader.running())
        for response_id in dead:
            self._fail(response_id)
        return len(dead)

    def _fail(self, response_id: str) -> None:
        """Write a cut-off response back as failed (if it is still running then)."""
        self.write(response_id, lambda: self._owners.failed_row(self._writer.db, response_id))

    # -- reads ---------------------------------------------------------------------------

    def load(self, response_id: str, *, chain: bool = False) -> list[Row]:
        """The response's row (hidden ones are not found), with ``chain`` its ancestors
        first: ``[root, ..., response]``; a running one cut off by a crash reads as failed."""
        rows = self._reader.rows(response_id, chain=chain)
        last = rows[-1] if rows else None
        if last and last["status"] in RUNNING and not self._owners.alive(last["owner"] or ""):
            rows[-1] = cut_off(last)
            self._fail(response_id)
        return rows

    def query(self, sql: str, params: Sequence[Any] = ()) -> list[sqlite3.Row]:
        return self._reader.query(sql, params)

    def count(self) -> int:
        return self._reader.count()

    def stats(self) -> dict[str, Any]:
        size = 0
        for suffix in ("", "-wal"):
            with contextlib.suppress(OSError):
                size += os.path.getsize(f"{self.path}{suffix}")
        writer = self._writer
        return {
            "path": str(self.path),
            "responses": self.count(),
            "file_bytes": size,
            "pending": writer.count_pending(),
            "written": writer.written,  # rows (a response is written as started and as ended)
            "write_seconds": writer.write_seconds,
            "error": writer.error,
            "writable": writer.writable,
        }
