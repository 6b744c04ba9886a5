"""``nbr.record(response)``: keep a Response made elsewhere (OpenAI, vLLM, a server) in the
history, with where it came from.

``nbr.history()`` holds what this engine generated; responses from a remote API are kept
only when asked, one call per response (opt-in: nothing remote is written on its own). The
row records the model and the server's host (``origin`` column; ``engine`` column:
``{"source": "remote", "host": ..., "model": ...}``), never a key: only the host part of
``base_url`` is kept.

Recording never destroys: a response already in the file (an ``nbresponses serve`` on the
same file stored it) keeps its input, recipe, timings and chain, and gains only its origin
and the time it was recorded (the merge is the database's upsert, ``storage/schema.py``).
Without ``input``, the input is asked of the server (``GET /responses/{id}/input_items``,
which OpenAI, vLLM and nbresponses answer for stored responses); a server that kept nothing
leaves it empty, and a warning says to pass ``input=``.
"""

from __future__ import annotations

import os
import warnings
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import openai
from openai.types.responses import Response

from nbresponses.protocol.items import InputItem, normalize_input
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
    api_key: str | None = None,
    where: Any = None,
) -> str:
    """Keep ``response`` (an ``openai.types.responses.Response``, or its dict) in the SQLite
    history, with its ``input`` (what the request sent, for the history's input column and
    search) and the host of ``base_url`` (the API it came from) as its origin; returns its
    id. Without ``input`` it is fetched from ``base_url`` when the server kept it (with
    ``api_key``, else ``$OPENAI_API_KEY``; the key is sent there and never stored).
    ``where``: an engine, a client, a database file, or None (the default store)."""
    response = Response.model_validate(response) if isinstance(response, dict) else response
    if not isinstance(response, Response):
        raise TypeError(f"record() keeps an openai Response, not {type(response).__name__}")
    parts = urlsplit(base_url) if base_url else None
    host, port = (parts.hostname, parts.port) if parts else (None, None)
    provenance = {
        "source": "remote",
        "host": f"{host}:{port}" if host and port else host,
        "model": response.model,
    }
    database, opened = _database(where)
    if database is None:
        raise ValueError("this store keeps nothing on disk ('memory' or 'off'): give where=")
    items: list[InputItem] = []
    if input is not None:
        items = normalize_input(input)
    elif base_url and not _has_input(database, response.id):
        if getattr(response, "store", None) is False:
            warnings.warn(
                f"the input of {response.id} was not recorded: it was made with store=false, "
                "so the server kept none; pass input= to keep it",
                UserWarning,
                stacklevel=2,
            )
        else:
            items = fetch_input(response.id, base_url, api_key) or []
    kept = Record(
        run=ResponseRun.restored(response, events=[], replay={}, timings={}),
        input=items,
        context=[],
        provenance=provenance,
    )
    database.write(response.id, lambda: to_row(kept))
    database.flush()
    if opened:
        database.close()
    return response.id


def _has_input(database: ResponseDatabase, response_id: str) -> bool:
    """Whether the file holds this response with its input (then recording keeps it)."""
    database.flush()
    rows = database.query("SELECT input FROM responses WHERE id = ?", (response_id,))
    return bool(rows) and rows[0]["input"] != "[]"


def fetch_input(
    response_id: str, base_url: str, api_key: str | None = None
) -> list[InputItem] | None:
    """The input items the server at ``base_url`` kept for ``response_id``, oldest first;
    None (with a warning) when it kept none or could not be asked."""
    parts = urlsplit(base_url)
    path = parts.path.rstrip("/")
    if path.endswith("/responses"):  # a stream's request URL: the API is its parent
        path = path[: -len("/responses")]
    api = urlunsplit((parts.scheme, parts.netloc.rpartition("@")[2], path, "", ""))
    key = api_key or os.environ.get("OPENAI_API_KEY") or "none"
    try:
        with openai.OpenAI(base_url=api, api_key=key, max_retries=0, timeout=30) as client:
            items = client.responses.input_items.list(response_id, order="asc")
            found = [item.model_dump(exclude_unset=True) for item in items]
    except (openai.OpenAIError, ValueError) as exc:
        warnings.warn(
            f"the input of {response_id} was not recorded: {api} did not give it ({exc}); "
            "pass input= to keep it",
            UserWarning,
            stacklevel=3,
        )
        return None
    try:
        return normalize_input(found)
    except Exception as exc:  # an item kind this package does not read (an image, a file)
        warnings.warn(
            f"the input of {response_id} was not recorded: {exc}; pass input= to keep it",
            UserWarning,
            stacklevel=3,
        )
        return None


def _keep_shown(response: Any, base_url: str | None, input: Any = None) -> None:
    record(response, input=input, base_url=base_url)


register_recorder(_keep_shown)
