"""The response store: bounded by count and bytes, least recently used first out.

A record keeps the response (through its run), the request's own input items and the whole
conversation before it, so a ``previous_response_id`` chain is restored from one record even
after its ancestors were evicted. Items are shared by reference along a chain, so the store
counts each item once however many records hold it, and frees its bytes only when the last of
them goes: the byte bound is a bound on what is really held (``footprint``: memory, not JSON
length, which is several times smaller).
Responses still running are never evicted; evicting one only forgets it here.

With a ``ResponseDatabase`` behind it the LRU is a cache: every stored response is written to
SQLite (as started, then as finished, by the database's writer thread), and a response not in
memory (evicted, or from before a restart, or from another process) is read from there.

Every store registers itself with ``nbresponses.traffic.lookup.stored`` when it is made (held
weakly: it leaves when it is collected), so frames find the responses it holds by id without
importing it; once its database is closed it answers from memory only.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from openai.types.responses import Response

from nbresponses.service.codec import from_rows, to_row
from nbresponses.service.database import RUNNING, ResponseDatabase, StorePath
from nbresponses.service.footprint import footprint
from nbresponses.service.record import Record
from nbresponses.service.run import ResponseRun
from nbresponses.traffic.lookup import stored

__all__ = ["STORE_DEFAULTS", "Record", "ResponseStore", "StoreDefaults"]


@dataclass(frozen=True)
class StoreDefaults:
    """The store's defaults, the one place ``nbr.Engine``, ``AsyncResponsesClient`` and
    ``ResponseStore`` take them from.

    ``max_responses`` / ``max_bytes`` bound the records held in memory (the LRU); the file
    is bounded only when asked (``keep_days`` / ``max_disk_bytes``: None, keep everything).
    Where responses are kept differs by entry point, on purpose: ``nbr.Engine`` is what a
    user holds, so it keeps them in the SQLite file (``engine_path`` None: ``$NBRESPONSES_STORE``,
    else ``responses.sqlite3`` in the user data dir; see ``open_database``) and ``retrieve``,
    chains and ``nbr.history()`` outlive a restart; an ``AsyncResponsesClient`` built
    directly serves a token source of one's own (a test's scripted one, an embedding
    program), so it keeps them in this process (``client_path`` "memory") and writes no
    user's file unasked.
    """

    max_responses: int = 1000
    max_bytes: int = 64 * 2**20
    keep_days: float | None = None
    max_disk_bytes: int | None = None
    engine_path: StorePath = None
    client_path: StorePath = "memory"


STORE_DEFAULTS = StoreDefaults()


class ResponseStore:
    """LRU over records; ``get`` refreshes recency, ``put`` evicts finished records past a bound."""

    def __init__(
        self,
        max_responses: int = STORE_DEFAULTS.max_responses,
        max_bytes: int = STORE_DEFAULTS.max_bytes,
        database: ResponseDatabase | None = None,
    ) -> None:
        self.max_responses = max_responses
        self.max_bytes = max_bytes
        self.database = database
        self._records: OrderedDict[str, Record] = OrderedDict()
        self._counted: dict[str, list[Any]] = {}  # record id -> the items it counts
        self._items: dict[int, _Shared] = {}  # id(item) -> size and number of counting records
        self._bytes = 0
        stored.register(self)

    def __repr__(self) -> str:
        database = self.database
        where = "" if database is None else f", file {database.path}"
        closed = " (closed)" if database is not None and database.closed else ""
        return f"<ResponseStore: {len(self)} responses in memory{where}{closed}>"

    def __len__(self) -> int:
        return len(self._records)

    def __contains__(self, response_id: object) -> bool:
        return response_id in self._records

    def __iter__(self) -> Iterator[str]:
        """The ids held in memory, least recently used first (a copy: deleting is fine)."""
        return iter(list(self._records))

    @property
    def bytes(self) -> int:
        """What the stored records hold, each shared item counted once."""
        return self._bytes

    def get(self, response_id: str) -> Record | None:
        """The record, from memory or else from the database (without its ancestors)."""
        record = self._records.get(response_id)
        if record is not None:
            self._records.move_to_end(response_id)
            return record
        return self._load(response_id, chain=False)

    def find(self, response_id: str) -> Response | None:
        """The stored Response with this id, or None: what frames read ids through."""
        record = self.get(response_id)
        return None if record is None else record.run.response

    def parent(self, response_id: str) -> Record | None:
        """The record with the conversation before it, to continue from."""
        record = self.get(response_id)
        if record is not None and record.partial:
            record = self._load(response_id, chain=True)
        return record

    def _load(self, response_id: str, *, chain: bool) -> Record | None:
        database = self.database
        if database is None or database.closed:
            return None
        pending = database.pending(response_id)
        if pending is not None and (pending.delete or pending.record is not None):
            return None if pending.delete else pending.record  # the queued write holds it
        rows = database.load(response_id, chain=chain)
        if not rows:
            return None
        record = from_rows(rows, chain=chain)
        if record.run.response.status not in RUNNING:  # another process's live one may change
            self._records[response_id] = record
            self.settled(record, write=False)
        return record

    def running(self) -> list[Record]:
        """The records of this process still generating."""
        return [r for key, r in self._records.items() if key not in self._counted and r.run.task]

    def put(self, record: Record) -> None:
        self._records[record.run.id] = record
        self._records.move_to_end(record.run.id)
        if self.database is not None:
            row = {**to_row(record), "owner": self.database.owner}  # as started: small
            self.database.write(record.run.id, lambda: row, record)
        self.evict()

    def remove(self, response_id: str) -> Record | None:
        """Forget a response here and on disk (``delete``)."""
        record = self._forget(response_id)
        if self.database is not None:
            self.database.delete(response_id)
        return record

    def _forget(self, response_id: str) -> Record | None:
        record = self._records.pop(response_id, None)
        if record is not None:
            self._uncount(record)
        return record

    def finished(self, run: ResponseRun) -> None:
        """A run's callback as it ends: settle its record, when this store holds it."""
        record = self._records.get(run.id)
        if record is not None and record.run is run:
            self.settled(record)

    def settled(self, record: Record, *, write: bool = True) -> None:
        """A stored run finished: write it, count it and enforce the bounds."""
        if record.run.id in self._records and record.run.id not in self._counted:
            if write and self.database is not None:
                self.database.write(record.run.id, lambda: to_row(record), record)
            self._bytes += record.measure()
            items = record.items()
            for item in items:
                shared = self._items.get(id(item))
                if shared is None:
                    shared = self._items[id(item)] = _Shared(item, footprint([item]))
                    self._bytes += shared.size
                shared.holders += 1
            self._counted[record.run.id] = items
            self.evict()

    def _uncount(self, record: Record) -> None:
        items = self._counted.pop(record.run.id, None)
        if items is None:
            return  # still running: nothing counted yet
        self._bytes -= record.size
        for item in items:
            shared = self._items[id(item)]
            shared.holders -= 1
            if not shared.holders:
                del self._items[id(item)]
                self._bytes -= shared.size

    def evict(self) -> None:
        for key in list(self._records):
            if len(self._records) <= self.max_responses and self._bytes <= self.max_bytes:
                return
            if key not in self._counted:
                continue  # never drop a response that is still running
            self._forget(key)  # out of memory; on disk it stays


@dataclass
class _Shared:
    """One item counted by the store; ``item`` keeps the object (so its id stays unique)."""

    item: Any
    size: int
    holders: int = 0
