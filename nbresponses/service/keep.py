"""``nbr.record(response)``: keep a Response made elsewhere (OpenAI, vLLM, a server) in the
history, with where it came from.

``nbr.history()`` holds what this engine generated; responses from a remote API are kept
only when asked, one call per response (opt-in: nothing remote is written on its own). The
row records the model and the server's host (``engine`` column: ``{"source": "remote",
"host": ..., "model": ...}``), never a key: only the host part of ``base_url`` is kept.
"""

from __future__ import annotations

import os
from typing import Any
from urllib.parse import urlsplit

from openai.types.responses import Response

from nbresponses.protocol.items import normalize_input
from nbresponses.service.codec import to_row
from nbresponses.service.database import (
    _OPEN,
    STORE_ENV,
    ResponseDatabase,
    default_path,
    open_database,
)
from nbresponses.service.record import Record
from nbresponses.service.run import ResponseRun
from nbresponses.traffic.recording import register_recorder


def _database(where: Any) -> tuple[ResponseDatabase | None, bool]:
    """The database to write to (one already open for that file when there is one), and
    whether it was opened here (then it is closed after the write)."""
    if isinstance(where, ResponseDatabase):
        return where, False
    if where is not None and not isinstance(where, str | os.PathLike):
        client = where.client() if callable(getattr(where, "client", None)) else where
        database = getattr(getattr(client, "store", None), "database", None)
        if not isinstance(database, ResponseDatabase):
            raise TypeError(f"record() writes to an engine's store or a file, not {where!r}")
        return database, False
    path = where if where is not None else os.environ.get(STORE_ENV) or default_path()
    if isinstance(path, str) and path in ("memory", "off"):
        return None, False
    for database in list(_OPEN):
        if os.path.abspath(database.path) == os.path.abspath(os.path.expanduser(path)):
            return database, False
    return open_database(path), True


def record(
    response: Response | Any,
    *,
    input: Any = None,
    base_url: str | None = None,
    where: Any = None,
) -> str:
    """Keep ``response`` (an ``openai.types.responses.Response``, or its dict) in the SQLite
    history, with its ``input`` (what the request sent, for the history's input column and
    search) and the host of ``base_url`` (the API it came from) as its provenance; returns its
    id. ``where``: an engine, a client, a database file, or None (the default store)."""
    response = Response.model_validate(response) if isinstance(response, dict) else response
    if not isinstance(response, Response):
        raise TypeError(f"record() keeps an openai Response, not {type(response).__name__}")
    host = urlsplit(base_url).hostname if base_url else None
    port = urlsplit(base_url).port if base_url else None
    provenance = {
        "source": "remote",
        "host": f"{host}:{port}" if host and port else host,
        "model": response.model,
    }
    kept = Record(
        run=ResponseRun.restored(response, events=[], replay={}, timings={}),
        input=normalize_input(input) if input is not None else [],
        context=[],
        provenance=provenance,
    )
    database, opened = _database(where)
    if database is None:
        raise ValueError("this store keeps nothing on disk ('memory' or 'off'): give where=")
    database.write(response.id, lambda: to_row(kept))
    database.flush()
    if opened:
        database.close()
    return response.id


def _keep_shown(response: Any, base_url: str | None) -> None:
    record(response, base_url=base_url)


register_recorder(_keep_shown)
