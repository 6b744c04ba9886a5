"""A stored record as a database row and back: the SDK's own types, dumped as JSON.

Every object is dumped with ``exclude_unset`` and read back with the SDK's pydantic models, so
a response read after a restart is equal to the one generated and serializes to the same JSON
(fields never set stay absent). A chain is not copied into each row: a row names its
``previous_response_id`` and the conversation before it is rebuilt from its ancestors' rows.
"""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from openai.types.responses import Response, ResponseOutputItem, ResponseStreamEvent
from pydantic import TypeAdapter
from pydantic_core import to_jsonable_python

from nbresponses.protocol.items import InputItem
from nbresponses.service.database import Row, dumps
from nbresponses.service.record import Record
from nbresponses.service.run import ResponseRun

ENGINE_ORIGIN = "engine"  # a row's origin when an nbresponses engine made it (else a host)


@functools.cache
def _adapter(kind: str) -> TypeAdapter[Any]:
    """Built on first use, not at import: the three cost ~90 ms, a sixth of what importing
    the engine costs (``Engine.load`` of a prepared model aims at 1.5 s in all)."""
    types: dict[str, Any] = {
        "input": list[InputItem],
        "output": dict[str, ResponseOutputItem],
        "events": list[ResponseStreamEvent],
    }
    return TypeAdapter(types[kind])


def to_row(record: Record) -> Row:
    """The row of a record as it stands (a running one: as started; see ``cut_off``)."""
    run = record.run
    response = run.response
    output_ids = {getattr(i, "id", None): i for i in response.output}
    replay = {k: v for k, v in run.replay.items() if output_ids.get(k) is not v}
    usage = response.usage
    error = response.error.message if response.error is not None else None
    provenance = record.provenance or {}
    recorded = provenance.get("source") == "remote"  # nbr.record: made elsewhere
    row: Row = {
        "id": response.id,
        "created_at": response.created_at,
        "updated_at": time.time(),
        "model": response.model,
        "status": response.status or "completed",
        "background": int(record.background),
        "previous_response_id": response.previous_response_id,
        "input_tokens": usage.input_tokens if usage else None,
        "output_tokens": usage.output_tokens if usage else None,
        "reasoning_tokens": usage.output_tokens_details.reasoning_tokens if usage else None,
        "cached_tokens": usage.input_tokens_details.cached_tokens if usage else None,
        "metadata": dumps(response.metadata) if response.metadata else None,
        "error": error,
        "recipe": provenance.get("recipe"),
        "model_hash": provenance.get("model_hash"),
        "owner": None,
        "response": response.model_dump_json(exclude_unset=True, by_alias=True),
        "input": _dump_items(record.input),
        "replay": _adapter("output").dump_json(replay, exclude_unset=True, by_alias=True).decode()
        if replay
        else None,
        "events": (
            _adapter("events").dump_json(run.events, exclude_unset=True, by_alias=True).decode()
            if record.background and run.events
            else None
        ),
        "request": dumps(to_jsonable_python(record.request or {}, fallback=repr)),
        "engine": dumps({**provenance, "timings": run.timings}),
        "input_text": "\n".join(_texts(record.input, response.instructions)),
        "output_text": "\n".join(_texts(response.output)),
        "origin": (provenance.get("host") or "remote") if recorded else ENGINE_ORIGIN,
        "recorded_at": time.time() if recorded else None,
    }
    row["size"] = sum(len(v) for v in row.values() if isinstance(v, str))
    return row


def from_rows(rows: Sequence[Mapping[str, Any]], *, chain: bool) -> Record:
    """The record of the last row; with ``chain`` the rows are its ancestors first, and the
    conversation before it is theirs (``Record.partial`` when it could not be rebuilt)."""
    row = rows[-1]
    record = Record(
        run=ResponseRun.restored(
            Response.model_validate_json(row["response"]),
            events=_adapter("events").validate_json(row["events"]) if row["events"] else [],
            replay=_adapter("output").validate_json(row["replay"]) if row["replay"] else {},
            timings=json.loads(row["engine"] or "{}").get("timings") or {},
        ),
        input=_adapter("input").validate_json(row["input"]),
        context=[],
        background=bool(row["background"]),
        request=json.loads(row["request"] or "{}"),
        provenance={k: v for k, v in json.loads(row["engine"] or "{}").items() if k != "timings"},
    )
    if chain:
        complete = rows[0]["previous_response_id"] is None
        context: list[Any] = []
        for ancestor in rows[:-1]:
            context = from_rows([ancestor], chain=False).conversation(context)
        record.context = context
        record.partial = not complete
    else:
        record.partial = row["previous_response_id"] is not None
    return record


def _dump_items(items: Sequence[Any]) -> str:
    return "[" + ",".join(i.model_dump_json(exclude_unset=True, by_alias=True) for i in items) + "]"


def _texts(items: Iterable[Any], instructions: Any = None) -> list[str]:
    """What full-text search reads: message text, reasoning, call names and arguments."""
    texts = [instructions] if isinstance(instructions, str) and instructions else []
    for item in items:
        for key in ("name", "arguments", "output", "code"):
            value = getattr(item, key, None)
            if isinstance(value, str) and value:
                texts.append(value)
        for part in [*(getattr(item, "content", None) or ()), *getattr(item, "summary", ())]:
            text = getattr(part, "text", None)
            if isinstance(text, str) and text:
                texts.append(text)
        if isinstance(getattr(item, "content", None), str):
            texts.append(item.content)
    return texts
