"""One stored response: its run, its input, and the conversation before it."""

from __future__ import annotations

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
    request: dict[str, Any] | None = None  # the create parameters, as stored
    provenance: dict[str, Any] | None = None  # the model that made it: name, recipe, hash
    partial: bool = False  # read from disk without the conversation before it

    def conversation(self, context: list[Any] | None = None) -> list[Any]:
        """The conversation through this response's output: what a child continues from.

        Output items are taken as the model saw them (``output_reader.replay``): e.g. a code
        interpreter call keeps its logs for the next turn even when the response leaves its
        ``outputs`` out.
        """
        replay = self.run.replay
        output = [replay.get(getattr(i, "id", None) or "", i) for i in self.run.response.output]
        return [*(self.context if context is None else context), *self.input, *output]

    def items(self) -> list[Any]:
        """Every item object this record holds (shared ones included)."""
        return [*self.context, *self.input, *self.run.response.output, *self.run.replay.values()]

    def measure(self) -> int:
        """Bytes of what is this record's alone: the response (its output counted as items)
        and what its run holds (for a background response, the replayable events)."""
        response = self.run.response
        seen = {id(response.output), *(id(i) for i in self.items())}
        own = [response, vars(self), *self.run.footprint_parts()]  # context: its list, not items
        self.size = footprint(own, seen)
        return self.size
