"""The table of stored responses, its full-text index, and how a file gets there.

Why versioned migrations: the file outlives the nbresponses that wrote it. ``PRAGMA
user_version`` counts the migrations that ran; each runs once, in one transaction (two
processes opening a new file at once do not both run it), and a file from a newer nbresponses
is left untouched. The row's columns beside the Response JSON (status, tokens, text) are what
``nbr.history()`` filters on without parsing JSON.
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
from pathlib import Path
from typing import Any

from nbresponses.service.storage.errors import StoreError, is_read_only

Row = dict[str, Any]
RUNNING = ("queued", "in_progress")  # a row in these is being written by a live process

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
    # 2: where each row came from ("engine", or the host a recorded response came from), and
    # when it was recorded; rows recorded before it take their host from the engine column
    """
    ALTER TABLE responses ADD COLUMN origin TEXT;
    ALTER TABLE responses ADD COLUMN recorded_at REAL;
    UPDATE responses SET
        origin = CASE WHEN json_extract(engine, '$.source') = 'remote'
                      THEN COALESCE(json_extract(engine, '$.host'), 'remote') ELSE 'engine' END,
        recorded_at = CASE WHEN json_extract(engine, '$.source') = 'remote'
                           THEN updated_at END;
    CREATE INDEX responses_origin ON responses(origin);
    """,
]

COLUMNS = (
    "id", "created_at", "updated_at", "model", "status", "background", "previous_response_id",
    "input_tokens", "output_tokens", "reasoning_tokens", "cached_tokens", "metadata", "error",
    "recipe", "model_hash", "owner", "response", "input", "replay", "events", "request",
    "engine", "input_text", "output_text", "size", "origin", "recorded_at",
)  # fmt: skip


def _merge() -> str:
    """The ``DO UPDATE SET`` of a write onto a row already there: a merge, never a loss.

    A recording (a row whose ``engine`` says ``source: remote``: ``nbr.record``) onto a row an
    engine wrote keeps all of it (input, recipe, hashes, timings: what a chain is rebuilt
    from) and adds only where it came from and when (``origin``, ``recorded_at``); onto an
    earlier recording it replaces the response, keeping the input when it brings none. An
    engine's write (as started, as ended, cut off) replaces the content and keeps what a
    recording added. One statement, so two processes writing one file (a notebook recording,
    a server serving) end in the same row in either order.
    """
    recording = "json_extract(excluded.engine, '$.source') = 'remote'"
    onto_recorded = "COALESCE(json_extract(responses.engine, '$.source'), '') = 'remote'"
    keep_row = f"({recording} AND NOT {onto_recorded})"
    keep_input = f"({keep_row} OR ({recording} AND excluded.input = '[]'))"
    sets = {c: f"CASE WHEN {keep_row} THEN responses.{c} ELSE excluded.{c} END" for c in COLUMNS}
    for c in ("input", "input_text"):
        sets[c] = f"CASE WHEN {keep_input} THEN responses.{c} ELSE excluded.{c} END"
    inputs = "length({0}.input) + COALESCE(length({0}.input_text), 0)"
    sets["size"] = (
        f"CASE WHEN {keep_row} THEN responses.size WHEN {keep_input} "
        f"THEN excluded.size - {inputs.format('excluded')} + {inputs.format('responses')} "
        "ELSE excluded.size END"
    )
    sets["updated_at"] = "excluded.updated_at"
    sets["origin"] = (
        f"CASE WHEN {recording} OR responses.recorded_at IS NULL THEN excluded.origin "
        "ELSE responses.origin END"
    )
    sets["recorded_at"] = "COALESCE(excluded.recorded_at, responses.recorded_at)"
    return ", ".join(f"{c} = {sql}" for c, sql in sets.items() if c not in ("id", "created_at"))


UPSERT = (
    f"INSERT INTO responses ({', '.join(COLUMNS)}) VALUES ({', '.join('?' for _ in COLUMNS)}) "
    f"ON CONFLICT(id) DO UPDATE SET {_merge()}"
)


def connect(path: str | os.PathLike[str], busy_timeout: float) -> sqlite3.Connection:
    """A connection to the file, usable from any thread (one at a time).

    The settings are retried while another connection holds the file's write lock, up to
    ``busy_timeout``: turning a new file to WAL upgrades a read lock to a write lock, and
    SQLite answers "database is locked" at once there rather than wait (its busy handler
    would deadlock two such upgrades), so a second process opening a new file as the first
    created it fell back to keeping its responses in memory, lost at exit
    (tests/service/test_database.py)."""
    deadline = time.monotonic() + busy_timeout
    db: sqlite3.Connection | None = None
    try:
        db = sqlite3.connect(
            path, timeout=busy_timeout, isolation_level=None, check_same_thread=False
        )
        db.row_factory = sqlite3.Row
        while True:
            try:
                _settings(db)
                break
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) or time.monotonic() > deadline:
                    raise
                time.sleep(_LOCKED_PAUSE)
    except sqlite3.DatabaseError as exc:
        if db is not None:
            db.close()  # not left open on the file by a store that could not use it
        raise StoreError(f"{path} cannot be opened as a response store: {exc}") from exc
    return db


_LOCKED_PAUSE = 0.01  # seconds between two tries of a connection's settings


def _settings(db: sqlite3.Connection) -> None:
    # before anything is written (a no-op on a file that has tables): retention's
    # deletes give their pages back to the disk (PRAGMA incremental_vacuum)
    db.execute("PRAGMA auto_vacuum=INCREMENTAL")
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=NORMAL")  # WAL: durable at checkpoints, never corrupt
    db.execute("PRAGMA foreign_keys=ON")


def migrate(db: sqlite3.Connection, path: Path) -> sqlite3.OperationalError | None:
    """Bring the file to the current schema; the error when it is read-only (then it is read
    as it is), else None. A file that cannot be used raises ``StoreError``."""
    try:
        version = db.execute("PRAGMA user_version").fetchone()[0]
        if version > len(MIGRATIONS):
            raise StoreError(
                f"{path} has schema version {version}, written by a newer nbresponses "
                f"(this one knows {len(MIGRATIONS)}); it is left untouched."
            )
        if version < len(MIGRATIONS):
            _run_migrations(db)
    except sqlite3.OperationalError as exc:
        if is_read_only(exc):
            return exc
        raise StoreError(f"{path}: the schema could not be set up: {exc}") from exc
    except sqlite3.DatabaseError as exc:
        raise StoreError(f"{path} is not a usable response store: {exc}") from exc
    return None


def _run_migrations(db: sqlite3.Connection) -> None:
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


def _statements(script: str) -> list[str]:
    """Split a migration into statements (triggers hold ``;`` inside BEGIN ... END)."""
    statements, current = [], ""
    for line in script.splitlines():
        current += line + "\n"
        if sqlite3.complete_statement(current):
            statements.append(current.strip())
            current = ""
    return [s for s in statements if s.strip(" ;\n")]


def dumps(value: Any) -> str:
    """JSON as the row's columns hold it: compact, unicode kept."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)
