"""``nbr.history()``: every stored response as a DataFrame, from the SQLite store.

Reads the columns the store keeps beside each response (status, tokens, text), never the
JSON of the responses, so a filter over 100,000 rows answers in milliseconds; full-text
search uses the FTS5 index over input and output. The ids it returns are what
``nbr.logprobs_frame`` and the other frames accept: the open stores read them back, and
``StoreFile`` a file with no store open on it (the package registers the default file as the
frames' last resort). Imports only the database module: no engine, no model family.
"""

from __future__ import annotations

import json
import os
import re
import sqlite3
from collections.abc import Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

import pandas as pd
from openai.types.responses import Response

from nbresponses.service.database import (
    _OPEN,
    STORE_ENV,
    ResponseDatabase,
    default_path,
)

COLUMNS = [
    "id", "created_at", "status", "model", "input", "output", "input_tokens", "output_tokens",
    "reasoning_tokens", "cached_tokens", "metadata", "error", "previous_response_id",
    "background", "recipe", "model_hash",
]  # fmt: skip
_SELECT = (
    "SELECT r.id, r.created_at, r.status, r.model, r.input_text AS input, "
    "r.output_text AS output, r.input_tokens, r.output_tokens, r.reasoning_tokens, "
    "r.cached_tokens, r.metadata, r.error, r.previous_response_id, r.background, r.recipe, "
    "r.model_hash FROM responses r"
)
_INT_COLUMNS = ("input_tokens", "output_tokens", "reasoning_tokens", "cached_tokens")


def history(
    where: Any = None,
    *,
    since: Any = None,
    until: Any = None,
    model: str | None = None,
    status: str | list[str] | None = None,
    metadata: Mapping[str, str] | None = None,
    search: str | None = None,
    limit: int | None = 1000,
) -> pd.DataFrame:
    """Stored responses, newest first, one row each.

    ``where``: an engine, a client, a database file, or None (this machine's default store).
    ``since`` / ``until``: epoch seconds, datetimes or date strings (inclusive).
    ``search``: words that must all appear in the input or the output (stemmed: "walrus"
    finds "walruses"). ``metadata``: pairs that must all match. ``limit=None``: every row.
    """
    path = _path_of(where)
    if path is None or not Path(path).exists():
        return _empty()
    for database in list(_OPEN):  # this process's queued writes land first
        if database.path == Path(path).expanduser():
            database.flush(timeout=10)
    clauses: list[str] = ["r.hidden = 0"]
    params: list[Any] = []
    if since is not None:
        clauses.append("r.created_at >= ?")
        params.append(_epoch(since))
    if until is not None:
        clauses.append("r.created_at <= ?")
        params.append(_epoch(until))
    if model is not None:
        clauses.append("r.model = ?")
        params.append(model)
    if status is not None:
        statuses = [status] if isinstance(status, str) else list(status)
        clauses.append(f"r.status IN ({', '.join('?' for _ in statuses)})")
        params += statuses
    for key, value in (metadata or {}).items():
        clauses.append("json_extract(r.metadata, ?) = ?")
        params += ['$."' + key.replace('"', '""') + '"', value]
    sql = _SELECT
    if search:
        sql += " JOIN responses_fts f ON f.rowid = r.n"
        clauses.append("responses_fts MATCH ?")
        params.append(_match(search))
    sql += " WHERE " + " AND ".join(clauses) + " ORDER BY r.created_at DESC, r.n DESC"
    if limit is not None:
        sql += " LIMIT ?"
        params.append(int(limit))
    with _reader(path) as db:
        rows = db.execute(sql, params).fetchall()
    frame = pd.DataFrame([tuple(r) for r in rows], columns=COLUMNS)
    frame["created_at"] = pd.to_datetime(frame["created_at"], unit="s", utc=True)
    frame["metadata"] = [json.loads(m) if m else {} for m in frame["metadata"]]
    frame["background"] = frame["background"].astype(bool)
    for column in _INT_COLUMNS:
        frame[column] = frame[column].astype("Int64")
    return frame


class StoreFile:
    """Stored responses read by id from a SQLite file no store has open (a lookup for the
    frames: ``logprobs_frame(id, lookup=StoreFile(path))``); ``path=None`` is the default file,
    as ``history()`` reads it (``$NBRESPONSES_STORE`` is read at each lookup)."""

    def __init__(self, path: str | os.PathLike[str] | None = None) -> None:
        self.path = path

    def find(self, response_id: str) -> Response | None:
        path = _path_of(self.path)
        if path is None or not Path(path).exists():
            return None
        with _reader(path) as db:
            row = db.execute(
                "SELECT response FROM responses WHERE id = ? AND hidden = 0", (response_id,)
            ).fetchone()
        return None if row is None else Response.model_validate_json(row[0])

    def __repr__(self) -> str:
        path = _path_of(self.path)
        if path is None:
            return f"<no store file: {STORE_ENV} is memory or off>"
        return f"<store file {path}{'' if Path(path).exists() else ' (none yet)'}>"


def _path_of(where: Any) -> str | os.PathLike[str] | None:
    if where is None:
        env = os.environ.get(STORE_ENV)
        if env in ("memory", "off"):
            return None
        return env or default_path()
    if isinstance(where, str | os.PathLike):
        return where
    if isinstance(where, ResponseDatabase):
        return where.path
    client = where.client() if callable(getattr(where, "client", None)) else where
    database = getattr(getattr(client, "store", None), "database", None)
    if isinstance(database, ResponseDatabase):
        return database.path
    raise TypeError(f"history() reads an engine, a client or a database path, not {where!r}")


class _reader:
    """A read-only connection, closed on exit (``sqlite3.connect`` as a context only commits)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.db = sqlite3.connect(f"file:{Path(path).expanduser()}?mode=ro", uri=True)

    def __enter__(self) -> sqlite3.Connection:
        return self.db

    def __exit__(self, *exc: object) -> None:
        self.db.close()


def _epoch(value: Any) -> float:
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, datetime | str):
        stamp = pd.Timestamp(value)
        if stamp.tzinfo is None:
            stamp = stamp.tz_localize(datetime.now().astimezone().tzinfo)  # the user's clock
        return float(stamp.timestamp())
    raise TypeError(f"since / until take epoch seconds, a datetime or a date string: {value!r}")


def _match(text: str) -> str:
    """Plain words as an FTS5 query that needs them all (quoted: no query syntax)."""
    words = re.findall(r"\w+", text)
    if not words:
        raise ValueError(f"search={text!r} has no words to look for")
    return " ".join('"' + w + '"' for w in words)


def _empty() -> pd.DataFrame:
    return pd.DataFrame({c: pd.Series(dtype=object) for c in COLUMNS})
