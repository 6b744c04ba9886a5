"""The response store: bounded by count and bytes, least recently used first out.

A record keeps the response (through its run), the request's own input items and the whole
conversation before it, so a ``previous_response_id`` chain is restored from one record even
after its ancestors were evicted (items are shared by reference, so this costs little memory).
Responses still running are never evicted; evicting one only forgets it here.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from nbresponses.protocol.items import InputItem
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
        replay = self.run.decoder.replay
        output = [replay.get(getattr(i, "id", None) or "", i) for i in self.run.response.output]
        return [*self.context, *self.input, *output]

    def measure(self) -> int:
        items = [*self.input, *self.run.response.output]
        self.size = len(self.run.response.model_dump_json()) + sum(
            len(i.model_dump_json()) for i in items
        )
        if self.background:  # replayable events are kept too
            self.size += sum(len(e.model_dump_json()) for e in self.run.events)
        return self.size


class ResponseStore:
    """LRU over records; ``get`` refreshes recency, ``put`` evicts finished records past a bound."""

    def __init__(self, max_responses: int = 1000, max_bytes: int = 64 * 2**20) -> None:
        self.max_responses = max_responses
        self.max_bytes = max_bytes
        self._records: OrderedDict[str, Record] = OrderedDict()

    def __len__(self) -> int:
        return len(self._records)

    def __contains__(self, response_id: object) -> bool:
        return response_id in self._records

    @property
    def bytes(self) -> int:
        return sum(r.size for r in self._records.values())

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
        return self._records.pop(response_id, None)

    def settled(self, record: Record) -> None:
        """A stored run finished: measure it and enforce the bounds."""
        if record.run.id in self._records:
            record.measure()
            self.evict()

    def evict(self) -> None:
        total = self.bytes
        for key in list(self._records):
            if len(self._records) <= self.max_responses and total <= self.max_bytes:
                return
            record = self._records[key]
            if not record.run.done.is_set():
                continue  # never drop a response that is still running
            total -= record.size
            del self._records[key]
