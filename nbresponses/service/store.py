"""The response store: bounded by count and bytes, least recently used first out.

A record keeps the response (through its run), the request's own input items and the whole
conversation before it, so a ``previous_response_id`` chain is restored from one record even
after its ancestors were evicted. Items are shared by reference along a chain, so the store
counts each item once however many records hold it, and frees its bytes only when the last of
them goes: the byte bound is a bound on what is really held (``footprint``: memory, not JSON
length, which is several times smaller).
Responses still running are never evicted; evicting one only forgets it here.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from nbresponses.protocol.items import InputItem
from nbresponses.service.footprint import footprint
from nbresponses.service.run import ResponseRun


@dataclass
class Record:
    run: ResponseRun
    input: list[InputItem]
    context: list[Any]  # conversation before this request: ancestors' inputs and outputs
    size: int = 0
    background: bool = False

    def history(self) -> list[Any]:
        """The conversation through this response's output: what a child continues from.

        Output items are taken as the model saw them (``decoder.replay``): e.g. a code
        interpreter call keeps its logs for the next turn even when the response leaves its
        ``outputs`` out.
        """
        replay = self.run.replay
        output = [replay.get(getattr(i, "id", None) or "", i) for i in self.run.response.output]
        return [*self.context, *self.input, *output]

    def items(self) -> list[Any]:
        """Every item object this record holds (shared ones included)."""
        return [*self.context, *self.input, *self.run.response.output, *self.run.replay.values()]

    def measure(self) -> int:
        """Bytes of what is this record's alone: the response (its output counted as items)
        and, for background responses, the replayable events."""
        run = self.run
        response = run.response
        seen = {id(response.output), *(id(i) for i in self.items())}
        if not self.background:
            seen.add(id(run.events))  # emptied when it finished: only a background one replays
        own = [response, run.events, vars(self), *run.state()]  # context: its list, not items
        self.size = footprint(own, seen)
        return self.size


class ResponseStore:
    """LRU over records; ``get`` refreshes recency, ``put`` evicts finished records past a bound."""

    def __init__(self, max_responses: int = 1000, max_bytes: int = 64 * 2**20) -> None:
        self.max_responses = max_responses
        self.max_bytes = max_bytes
        self._records: OrderedDict[str, Record] = OrderedDict()
        self._counted: dict[str, list[Any]] = {}  # record id -> the items it counts
        self._items: dict[int, _Shared] = {}  # id(item) -> size and number of counting records
        self._bytes = 0

    def __len__(self) -> int:
        return len(self._records)

    def __contains__(self, response_id: object) -> bool:
        return response_id in self._records

    @property
    def bytes(self) -> int:
        """What the stored records hold, each shared item counted once."""
        return self._bytes

    def get(self, response_id: str) -> Record | None:
        record = self._records.get(response_id)
        if record is not None:
            self._records.move_to_end(response_id)
        return record

    def put(self, record: Record) -> None:
        self._records[record.run.id] = record
        self._records.move_to_end(record.run.id)
        self.evict()

    def remove(self, response_id: str) -> Record | None:
        record = self._records.pop(response_id, None)
        if record is not None:
            self._uncount(record)
        return record

    def settled(self, record: Record) -> None:
        """A stored run finished: count it and enforce the bounds."""
        if record.run.id in self._records and record.run.id not in self._counted:
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
            if not self._records[key].run.done.is_set():
                continue  # never drop a response that is still running
            self.remove(key)


@dataclass
class _Shared:
    """One item counted by the store; ``item`` keeps the object (so its id stays unique)."""

    item: Any
    size: int
    holders: int = 0
