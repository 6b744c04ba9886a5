"""Stored responses on disk: one SQLite file that outlives the kernel, shared by processes.

Why SQLite (the standard library's ``sqlite3``): one file in the user's data dir, safe for a
notebook and a ``nbresponses serve`` on the same machine (WAL: readers never wait for the
writer, writers queue on a busy timeout), FTS5 for searching the history, nothing to install.

Writes leave the event loop: the store hands rows (or a function that builds them, for the
large final ones) to one writer thread, which commits whatever is queued in one transaction.
A failing write (disk full, locked past the busy timeout, read-only, corrupt) warns once with
``StoreWarning``, keeps its rows to retry, and generation goes on in memory; nothing already
written is touched. A row written as running belongs to its process (``owner``); a process
holds an advisory lock on its owner file while it lives, so a row whose owner's lock is free
was cut off by a crash and is marked failed, never left ``in_progress``.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import json
import logging
import os
import queue
import sqlite3
import threading
import time
import uuid
import warnings
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from openai.types.responses import Response
from openai.types.responses.response_error import ResponseError

log = logging.getLogger(__name__)

RUNNING = ("queued", "in_progress")
MAX_RETRY = 1000  # failed writes kept to retry; older ones then live on in the memory store only

# One entry per schema version; a database at version N runs the entries after N, in order.
MIGRATIONS: list[str] = [
    """
    CREATE TABLE responses (
        n INTEGER PRIMARY KEY,              -- stable rowid: the FTS index points at it
        id TEXT NOT NULL UNIQUE,
        created_at REAL NOT NULL,
        updated_at REAL NOT NULL,
        model TEXT,
        status TEXT NOT NULL,
        background INTEGER NOT NULL DEFAULT 0,
        previous_response_id TEXT,
        input_tokens INTEGER,
        output_tokens INTEGER,
        reasoning_tokens INTEGER,
        cached_tokens INTEGER,
        metadata TEXT,                       -- JSON object
        error TEXT,
        recipe TEXT,
        model_hash TEXT,
        owner TEXT,                          -- the process writing it while it runs
        hidden INTEGER NOT NULL DEFAULT 0,   -- deleted or expired; kept while a child needs it
        response TEXT NOT NULL,              -- the Response (output, logprobs, usage, error)
        input TEXT NOT NULL,                 -- this request's input items
        replay TEXT,                         -- output items as the model saw them, when other
        events TEXT,                         -- a background response's events, for retrieve
        request TEXT,                        -- the create parameters
        engine TEXT,                         -- timings and the prepared model's provenance
        input_text TEXT,
        output_text TEXT,
        size INTEGER NOT NULL
    );
    CREATE INDEX responses_created ON responses(created_at);
    CREATE INDEX responses_previous ON responses(previous_response_id);
    CREATE INDEX responses_running ON responses(status) WHERE status IN ('queued', 'in_progress');
    CREATE VIRTUAL TABLE responses_fts USING fts5(
        input_text, output_text, content='responses', content_rowid='n',
        tokenize='porter unicode61'
    );
    CREATE TRIGGER responses_ai AFTER INSERT ON responses BEGIN
        INSERT INTO responses_fts(rowid, input_text, output_text)
        VALUES (new.n, new.input_text, new.output_text);
    END;
    CREATE TRIGGER responses_ad AFTER DELETE ON responses BEGIN
        INSERT INTO responses_fts(responses_fts, rowid, input_text, output_text)
        VALUES ('delete', old.n, old.input_text, old.output_text);
    END;
    CREATE TRIGGER responses_au AFTER UPDATE OF input_text, output_text ON responses BEGIN
        INSERT INTO responses_fts(responses_fts, rowid, input_text, output_text)
        VALUES ('delete', old.n, old.input_text, old.output_text);
        INSERT INTO responses_fts(rowid, input_text, output_text)
        VALUES (new.n, new.input_text, new.output_text);
    END;
    """,
]

COLUMNS = (
    "id", "created_at", "updated_at", "model", "status", "background", "previous_response_id",
    "input_tokens", "output_tokens", "reasoning_tokens", "cached_tokens", "metadata", "error",
    "recipe", "model_hash", "owner", "response", "input", "replay", "events", "request",
    "engine", "input_text", "output_text", "size",
)  # fmt: skip

Row = dict[str, Any]
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


class StoreWarning(UserWarning):
    """The response database could not be read or written; responses stay in memory."""


class StoreError(Exception):
    """The database cannot be used at all (corrupt, from a newer nbresponses, unreadable)."""


@dataclass
class _Write:
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
        self.keep_days = keep_days
        self.max_disk_bytes = max_disk_bytes
        self.busy_timeout = busy_timeout
        self.owner = f"{os.getpid()}-{uuid.uuid4().hex[:12]}"
        self.error: str | None = None  # the last write failure, until a write succeeds
        self.closed = False  # after close(): its store answers from memory only
        self.writable = True
        self.written = 0
        self.write_seconds = 0.0  # time the writer spent in transactions
        self._warned: set[str] = set()
        self._pending: dict[str, _Write] = {}  # queued or failed, by response id, for reads
        self._pending_lock = threading.Lock()
        self._queue: queue.Queue[_Write | None] = queue.Queue()
        self._read_lock = threading.Lock()
        self._owner_fd: int | None = None
        self._last_retention = 0.0
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._reader = self._connect()
        self._migrate()
        self._hold_owner_lock()
        self._writer = threading.Thread(target=self._write_loop, name="nbr-store", daemon=True)
        self._writer.start()
        _OPEN.add(self)
        self.recover()
        self.apply_retention()

    # -- connections and schema -------------------------------------------------------

    def _connect(self) -> sqlite3.Connection:
        try:
            db = sqlite3.connect(
                self.path, timeout=self.busy_timeout, isolation_level=None, check_same_thread=False
            )
            db.row_factory = sqlite3.Row
            # before anything is written (a no-op on a file that has tables): retention's
            # deletes give their pages back to the disk (PRAGMA incremental_vacuum)
            db.execute("PRAGMA auto_vacuum=INCREMENTAL")
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=NORMAL")  # WAL: durable at checkpoints, never corrupt
            db.execute("PRAGMA foreign_keys=ON")
        except sqlite3.DatabaseError as exc:
            raise StoreError(f"{self.path} cannot be opened as a response store: {exc}") from exc
        return db

    def _migrate(self) -> None:
        db = self._reader
        try:
            version = db.execute("PRAGMA user_version").fetchone()[0]
            if version > len(MIGRATIONS):
                raise StoreError(
                    f"{self.path} has schema version {version}, written by a newer nbresponses "
                    f"(this one knows {len(MIGRATIONS)}); it is left untouched."
                )
            if version == len(MIGRATIONS):
                return
            db.execute("BEGIN IMMEDIATE")
            try:
                version = db.execute("PRAGMA user_version").fetchone()[0]  # another process?
                for number in range(version, len(MIGRATIONS)):
                    for statement in _statements(MIGRATIONS[number]):
                        db.execute(statement)
                db.execute(f"PRAGMA user_version={len(MIGRATIONS)}")
                db.execute("COMMIT")
            except BaseException:
                db.execute("ROLLBACK")
                raise
        except sqlite3.OperationalError as exc:
            if "readonly" in str(exc) or "read-only" in str(exc):
                self._read_only(exc)
                return
            raise StoreError(f"{self.path}: the schema could not be set up: {exc}") from exc
        except sqlite3.DatabaseError as exc:
            raise StoreError(f"{self.path} is not a usable response store: {exc}") from exc

    def _read_only(self, exc: Exception) -> None:
        self.writable = False
        self._warn("readonly", f"{self.path} is read-only ({exc}): new responses stay in memory.")

    # -- owners ------------------------------------------------------------------------

    def _owner_file(self, owner: str) -> Path:
        return self.path.with_name(f"{self.path.name}-owners") / owner

    def _hold_owner_lock(self) -> None:
        """Lock this process's owner file for its lifetime (the OS frees it on any exit)."""
        try:
            import fcntl
        except ImportError:  # Windows: owners are judged by pid (see _alive)
            return
        path = self._owner_file(self.owner)
        try:
            path.parent.mkdir(exist_ok=True)
            fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o644)
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            self._owner_fd = fd
        except OSError as exc:
            log.debug("no owner lock for %s: %s", path, exc)

    def _alive(self, owner: str) -> bool:
        if owner == self.owner:
            return True
        try:
            import fcntl
        except ImportError:
            return _pid_alive(owner)
        path = self._owner_file(owner)
        try:
            fd = os.open(path, os.O_RDWR)
        except FileNotFoundError:
            return False  # its process closed cleanly (or never locked): it is gone
        except OSError:
            return _pid_alive(owner)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        except OSError:
            return _pid_alive(owner)
        finally:
            os.close(fd)
        with contextlib.suppress(OSError):
            path.unlink()
        return False

    def recover(self) -> int:
        """Mark running rows whose process is gone as failed; the number marked."""
        try:
            with self._read_lock:
                rows = self._reader.execute(
                    "SELECT id, owner FROM responses WHERE status IN ('queued', 'in_progress')"
                ).fetchall()
        except sqlite3.DatabaseError as exc:
            self._warn("read", f"{self.path} could not be read: {exc}")
            return 0
        alive = {owner: self._alive(owner) for owner in {row["owner"] or "" for row in rows}}
        dead = [row["id"] for row in rows if not alive[row["owner"] or ""]]
        for response_id in dead:
            self.write(response_id, functools.partial(self._failed_row, response_id))
        return len(dead)

    def _failed_row(self, response_id: str) -> Row | None:
        """The row of a response cut off by its process's end, as failed (runs in the writer)."""
        row = self._read_row(response_id, self._writer_db)
        if row is None or row["status"] not in RUNNING or self._alive(row["owner"] or ""):
            return None
        return cut_off(dict(row))

    # -- writes --------------------------------------------------------------------------

    def write(self, response_id: str, build: Callable[[], Row | None], record: Any = None) -> None:
        """Queue an upsert of a response's row; ``build`` runs in the writer thread."""
        self._enqueue(_Write(response_id, build=build, record=record))

    def delete(self, response_id: str) -> None:
        self._enqueue(_Write(response_id, delete=True))

    def _enqueue(self, op: _Write) -> None:
        with self._pending_lock:
            self._pending[op.key] = op
        self._queue.put(op)

    def pending(self, response_id: str) -> _Write | None:
        """A queued (or failed, to retry) write of this response: readers must not miss it."""
        with self._pending_lock:
            return self._pending.get(response_id)

    def in_writer(self, task: Callable[[sqlite3.Connection], Any], timeout: float = 30.0) -> Any:
        """Run ``task(connection)`` in the writer thread, after what is queued; its result.
        (Per-connection settings, maintenance; the tests set limits with it.)"""
        op = _Write("", task=task)
        self._queue.put(op)
        if not op.done.wait(timeout):
            raise TimeoutError("the store's writer did not answer")
        if isinstance(op.result, BaseException):
            raise op.result
        return op.result

    def flush(self, timeout: float | None = 30.0) -> bool:
        """Wait until everything queued so far is written (or failed); True if it was written."""
        marker = _Write("")
        self._queue.put(marker)
        if not marker.done.wait(timeout):
            return False
        with self._pending_lock:
            return not self._pending

    def close(self) -> None:
        """Write what is queued, stop the writer, release the owner lock."""
        _OPEN.discard(self)
        self.closed = True
        if self._writer.is_alive():
            self._queue.put(None)
            self._writer.join(timeout=30)
        with contextlib.suppress(Exception):
            self._reader.close()
        if self._owner_fd is not None:
            with contextlib.suppress(OSError):
                self._owner_file(self.owner).unlink()
                os.close(self._owner_fd)
            self._owner_fd = None

    def _write_loop(self) -> None:
        self._writer_db = self._connect()
        retry: list[_Write] = []
        closing = False
        while not closing:
            try:
                first: _Write | None = self._queue.get(timeout=1.0 if retry else None)
            except queue.Empty:
                first = _Write("")  # nothing new: retry the failed writes
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
        self._writer_db.close()

    def _commit(self, batch: list[_Write]) -> list[_Write]:
        """Write a batch in one transaction; the writes to retry (all of them on failure)."""
        writes = [op for op in batch if op.key]
        failed: list[_Write] = []
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
        if not failed and (
            any(op.retention for op in batch) or time.time() - self._last_retention > 60
        ):
            self._retention()
        for op in batch:
            if op.task is not None:
                try:
                    op.result = op.task(self._writer_db)
                except Exception as exc:  # handed back to the caller of in_writer
                    op.result = exc
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
            retry = retry[-MAX_RETRY:]
        for op in batch:
            op.done.set()  # a flush after a failure reports it; the write is retried
        return retry

    def _transaction(self, writes: list[_Write]) -> None:
        db = self._writer_db
        rows: list[tuple[_Write, Row | None]] = []
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
                    self._hide(db, [op.key])
                elif row is not None:
                    db.execute(_UPSERT, [row.get(c) for c in COLUMNS])
            db.execute("COMMIT")
        except BaseException:
            with contextlib.suppress(sqlite3.Error):
                db.execute("ROLLBACK")
            raise

    def _failed(self, exc: sqlite3.Error) -> None:
        text = str(exc)
        self.error = text
        if "readonly" in text or "read-only" in text:
            self._read_only(exc)
            return
        kind = "full" if "full" in text else "locked" if "locked" in text else "write"
        self._warn(
            kind,
            f"{self.path}: responses could not be written ({text}); they stay in memory and "
            "the write is retried.",
        )

    def _warn(self, kind: str, message: str) -> None:
        log.warning(message)
        if kind not in self._warned:
            self._warned.add(kind)
            warnings.warn(message, StoreWarning, stacklevel=2)

    # -- delete, retention ------------------------------------------------------------------

    def _forget(self, db: sqlite3.Connection, ids: Sequence[str]) -> None:
        """Retention's delete: one transaction, then the freed pages go back to the disk."""
        if not ids:
            return
        db.execute("BEGIN IMMEDIATE")
        try:
            self._hide(db, ids)
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise
        db.execute("PRAGMA incremental_vacuum")

    @staticmethod
    def _hide(db: sqlite3.Connection, ids: Sequence[str]) -> None:
        """Delete rows; a row a stored child continues from is hidden instead, and goes
        with the last such child."""
        db.executemany("UPDATE responses SET hidden = 1 WHERE id = ?", [(i,) for i in ids])
        while True:
            gone = db.execute(
                "DELETE FROM responses WHERE hidden = 1 AND NOT EXISTS "
                "(SELECT 1 FROM responses c WHERE c.previous_response_id = responses.id)"
            ).rowcount
            if not gone:
                return

    def apply_retention(self) -> None:
        """Forget responses older than ``keep_days`` and the oldest past ``max_disk_bytes``
        (in the writer, after what is queued; it also runs every minute of writing)."""
        self._queue.put(_Write("", retention=True))

    def _retention(self) -> None:
        self._last_retention = time.time()
        if self.keep_days is None and self.max_disk_bytes is None:
            return
        db = self._writer_db
        settled = "hidden = 0 AND status NOT IN ('queued', 'in_progress')"
        try:
            if self.keep_days is not None:
                cutoff = time.time() - self.keep_days * 86400
                query = f"SELECT id FROM responses WHERE {settled} AND created_at < ?"
                self._forget(db, [r[0] for r in db.execute(query, (cutoff,)).fetchall()])
            if self.max_disk_bytes is not None:
                total = db.execute("SELECT COALESCE(SUM(size), 0) FROM responses").fetchone()[0]
                query = f"SELECT id, size FROM responses WHERE {settled} ORDER BY created_at"
                ids = []
                for response_id, size in db.execute(query).fetchall():
                    if total <= self.max_disk_bytes:
                        break
                    ids.append(response_id)
                    total -= size
                self._forget(db, ids)
        except sqlite3.Error as exc:
            with contextlib.suppress(sqlite3.Error):
                db.execute("ROLLBACK")
            self._warn("retention", f"{self.path}: old responses could not be removed: {exc}")

    # -- reads ---------------------------------------------------------------------------

    @staticmethod
    def _read_row(response_id: str, db: sqlite3.Connection) -> sqlite3.Row | None:
        result: sqlite3.Row | None = db.execute(
            "SELECT * FROM responses WHERE id = ?", (response_id,)
        ).fetchone()
        return result

    def load(self, response_id: str, *, chain: bool = False) -> list[Row]:
        """The response's row (hidden ones are not found), with ``chain`` its ancestors
        first: ``[root, ..., response]``. An ancestor missing leaves the list short."""
        query = _CHAIN if chain else "SELECT * FROM responses WHERE id = ?"
        try:
            with self._read_lock:
                rows = [dict(r) for r in self._reader.execute(query, (response_id,))]
        except sqlite3.DatabaseError as exc:
            self._warn("read", f"{self.path} could not be read: {exc}")
            return []
        if not rows or rows[-1]["hidden"]:
            return []
        last = rows[-1]
        if last["status"] in RUNNING and not self._alive(last["owner"] or ""):
            rows[-1] = cut_off(last)
            self.write(response_id, functools.partial(self._failed_row, response_id))
        return rows

    def query(self, sql: str, params: Sequence[Any] = ()) -> list[sqlite3.Row]:
        with self._read_lock:
            return self._reader.execute(sql, params).fetchall()

    def count(self) -> int:
        return int(self.query("SELECT COUNT(*) FROM responses WHERE hidden = 0")[0][0])

    def stats(self) -> dict[str, Any]:
        size = 0
        for suffix in ("", "-wal"):
            with contextlib.suppress(OSError):
                size += os.path.getsize(f"{self.path}{suffix}")
        with self._pending_lock:
            pending = len(self._pending)
        return {
            "path": str(self.path),
            "responses": self.count(),
            "file_bytes": size,
            "pending": pending,
            "written": self.written,  # rows (a response is written as started and as ended)
            "write_seconds": self.write_seconds,
            "error": self.error,
            "writable": self.writable,
        }


_UPSERT = (
    f"INSERT INTO responses ({', '.join(COLUMNS)}) VALUES ({', '.join('?' for _ in COLUMNS)}) "
    "ON CONFLICT(id) DO UPDATE SET "
    + ", ".join(f"{c} = excluded.{c}" for c in COLUMNS if c not in ("id", "created_at"))
)

_CHAIN = """
WITH RECURSIVE chain(n, previous, depth) AS (
    SELECT n, previous_response_id, 0 FROM responses WHERE id = ?
    UNION ALL
    SELECT r.n, r.previous_response_id, chain.depth + 1
    FROM responses r JOIN chain ON r.id = chain.previous
)
SELECT responses.* FROM chain JOIN responses USING (n) ORDER BY chain.depth DESC
"""


def cut_off(row: Row) -> Row:
    """A running row whose process ended: failed, with the reason; output as last written."""
    response = Response.model_validate_json(row["response"])
    pid = (row["owner"] or "?").split("-")[0]
    message = (
        f"The process generating this response (pid {pid}) ended before it finished; "
        "what it generated after it was stored is lost."
    )
    response.status = "failed"
    response.error = ResponseError(code="server_error", message=message)
    return {
        **row,
        "status": "failed",
        "error": message,
        "owner": None,
        "updated_at": time.time(),
        "response": response.model_dump_json(exclude_unset=True, by_alias=True),
    }


def _statements(script: str) -> list[str]:
    """Split a migration into statements (triggers hold ``;`` inside BEGIN ... END)."""
    statements, current = [], ""
    for line in script.splitlines():
        current += line + "\n"
        if sqlite3.complete_statement(current):
            statements.append(current.strip())
            current = ""
    return [s for s in statements if s.strip(" ;\n")]


def _pid_alive(owner: str) -> bool:
    """Whether the owner's process may live (without owner locks: Windows, odd file systems)."""
    if os.name == "nt":
        return True  # os.kill would terminate it there; a live response is never failed
    try:
        pid = int(owner.split("-")[0])
        os.kill(pid, 0)
    except (ValueError, ProcessLookupError):
        return False
    except PermissionError:
        return True
    return True


def dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)
