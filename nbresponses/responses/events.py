"""The event builder: typed deltas in, ``ResponseStreamEvent``s out, with a live Response.

It owns the bookkeeping the protocol demands: one output item open at a time, ``output_index``
and ``content_index`` that follow the items, ``sequence_number`` from 0 strictly increasing,
and added/done pairs that nest (item > content part > deltas). Every event carries copies, so
what a consumer holds never changes under it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from openai.types.responses import (
    Response,
    ResponseCompletedEvent,
    ResponseContentPartAddedEvent,
    ResponseContentPartDoneEvent,
    ResponseCreatedEvent,
    ResponseError,
    ResponseErrorEvent,
    ResponseFailedEvent,
    ResponseFunctionCallArgumentsDeltaEvent,
    ResponseFunctionCallArgumentsDoneEvent,
    ResponseFunctionToolCall,
    ResponseIncompleteEvent,
    ResponseInProgressEvent,
    ResponseOutputItemAddedEvent,
    ResponseOutputItemDoneEvent,
    ResponseOutputMessage,
    ResponseOutputText,
    ResponseQueuedEvent,
    ResponseReasoningItem,
    ResponseReasoningTextDeltaEvent,
    ResponseReasoningTextDoneEvent,
    ResponseStreamEvent,
    ResponseTextDeltaEvent,
    ResponseTextDoneEvent,
    ResponseUsage,
)
from openai.types.responses import response_content_part_added_event as part_added
from openai.types.responses import response_content_part_done_event as part_done
from openai.types.responses import response_output_text as output_text
from openai.types.responses import response_text_delta_event as text_delta
from openai.types.responses import response_text_done_event as text_done
from openai.types.responses.response import IncompleteDetails
from openai.types.responses.response_reasoning_item import Content

from nbresponses.responses.ids import new_id

ItemStatus = Literal["completed", "incomplete"]
Terminal = Literal["completed", "incomplete", "failed", "cancelled"]


@dataclass(frozen=True)
class TokenLogprob:
    """One generated token's logprob in protocol terms (display string, bytes, alternatives)."""

    token: str
    bytes: list[int]
    logprob: float
    top: list[tuple[str, list[int], float]]

    def for_output(self) -> output_text.Logprob:
        tops = [output_text.LogprobTopLogprob(token=t, bytes=b, logprob=v) for t, b, v in self.top]
        return output_text.Logprob(
            token=self.token, bytes=self.bytes, logprob=self.logprob, top_logprobs=tops
        )

    def for_delta(self) -> text_delta.Logprob:
        tops = [text_delta.LogprobTopLogprob(token=t, logprob=v) for t, _, v in self.top]
        return text_delta.Logprob(token=self.token, logprob=self.logprob, top_logprobs=tops)

    def for_done(self) -> text_done.Logprob:
        tops = [text_done.LogprobTopLogprob(token=t, logprob=v) for t, _, v in self.top]
        return text_done.Logprob(token=self.token, logprob=self.logprob, top_logprobs=tops)


class EventBuilder:
    """Builds one response's events; ``emit`` receives each event as it is made."""

    def __init__(self, response: Response, emit: Callable[[ResponseStreamEvent], None]) -> None:
        self.response = response
        self._emit = emit
        self._seq = 0
        self._item: Any = None  # the open output item
        self._text = ""
        self._logprobs: list[TokenLogprob] = []

    # -- plumbing -------------------------------------------------------------------------

    def _send(self, cls: type, **fields: Any) -> None:
        event = cls(sequence_number=self._seq, **fields)
        self._seq += 1
        self._emit(event)

    def _snapshot(self) -> Response:
        return self.response.model_copy(deep=True)

    @property
    def _index(self) -> int:
        return len(self.response.output) - 1

    def _add(self, item: Any) -> None:
        self.response.output.append(item)
        self._item = item
        self._text = ""
        self._logprobs = []
        self._send(
            ResponseOutputItemAddedEvent,
            type="response.output_item.added",
            output_index=self._index,
            item=item.model_copy(deep=True),
        )

    def _item_done(self) -> None:
        self._send(
            ResponseOutputItemDoneEvent,
            type="response.output_item.done",
            output_index=self._index,
            item=self._item.model_copy(deep=True),
        )
        self._item = None

    @property
    def open_kind(self) -> str | None:
        return None if self._item is None else self._item.type

    # -- lifecycle ------------------------------------------------------------------------

    def created(self) -> None:
        self._send(ResponseCreatedEvent, type="response.created", response=self._snapshot())

    def queued(self) -> None:
        self.response.status = "queued"
        self._send(ResponseQueuedEvent, type="response.queued", response=self._snapshot())

    def in_progress(self) -> None:
        self.response.status = "in_progress"
        self._send(ResponseInProgressEvent, type="response.in_progress", response=self._snapshot())

    def finish(
        self,
        status: Terminal,
        usage: ResponseUsage | None,
        *,
        error: str | None = None,
        incomplete_reason: str | None = None,
    ) -> None:
        """Close what is open and emit the terminal event (none for cancelled: OpenAI has none)."""
        self.close(status="completed" if status == "completed" else "incomplete")
        r = self.response
        r.status = status
        r.usage = usage
        if status == "completed":
            r.completed_at = time.time()
            self._send(ResponseCompletedEvent, type="response.completed", response=self._snapshot())
        elif status == "incomplete":
            r.incomplete_details = IncompleteDetails(reason=incomplete_reason)  # type: ignore[arg-type]
            self._send(
                ResponseIncompleteEvent, type="response.incomplete", response=self._snapshot()
            )
        elif status == "failed":
            message = error or "The engine failed."
            r.error = ResponseError(code="server_error", message=message)
            self._send(
                ResponseErrorEvent, type="error", code="server_error", message=message, param=None
            )
            self._send(ResponseFailedEvent, type="response.failed", response=self._snapshot())

    # -- items ----------------------------------------------------------------------------

    def close(self, status: ItemStatus = "completed") -> None:
        """Finish the open item (if any) with the given status."""
        if self._item is None:
            return
        kind = self._item.type
        if kind == "message":
            self._close_message(status)
        elif kind == "reasoning":
            self._close_reasoning(status)
        else:
            self.close_call(self._item.arguments, status)

    def open_message(self) -> None:
        self.close()
        self._add(
            ResponseOutputMessage(
                type="message",
                id=new_id("msg"),
                role="assistant",
                status="in_progress",
                content=[],
            )
        )
        part = ResponseOutputText(type="output_text", text="", annotations=[], logprobs=[])
        self._item.content.append(part)
        self._part_event(ResponseContentPartAddedEvent, "response.content_part.added", part)

    def _part_event(self, cls: type, kind: str, part: Any) -> None:
        self._send(
            cls,
            type=kind,
            item_id=self._item.id,
            output_index=self._index,
            content_index=0,
            part=part.model_copy(deep=True),
        )

    def text_delta(self, text: str, logprobs: list[TokenLogprob]) -> None:
        part = self._item.content[0]
        part.text += text
        part.logprobs = [*(part.logprobs or []), *(lp.for_output() for lp in logprobs)]
        self._logprobs.extend(logprobs)
        self._send(
            ResponseTextDeltaEvent,
            type="response.output_text.delta",
            item_id=self._item.id,
            output_index=self._index,
            content_index=0,
            delta=text,
            logprobs=[lp.for_delta() for lp in logprobs],
        )

    def _close_message(self, status: ItemStatus) -> None:
        part = self._item.content[0]
        self._send(
            ResponseTextDoneEvent,
            type="response.output_text.done",
            item_id=self._item.id,
            output_index=self._index,
            content_index=0,
            text=part.text,
            logprobs=[lp.for_done() for lp in self._logprobs],
        )
        self._part_event(ResponseContentPartDoneEvent, "response.content_part.done", part)
        self._item.status = status
        self._item_done()

    def open_reasoning(self) -> None:
        self.close()
        self._add(
            ResponseReasoningItem(
                type="reasoning", id=new_id("rs"), summary=[], content=[], status="in_progress"
            )
        )
        self._part_event(
            ResponseContentPartAddedEvent,
            "response.content_part.added",
            part_added.PartReasoningText(type="reasoning_text", text=""),
        )

    def reasoning_delta(self, text: str) -> None:
        self._text += text
        self._send(
            ResponseReasoningTextDeltaEvent,
            type="response.reasoning_text.delta",
            item_id=self._item.id,
            output_index=self._index,
            content_index=0,
            delta=text,
        )

    def _close_reasoning(self, status: ItemStatus) -> None:
        self._send(
            ResponseReasoningTextDoneEvent,
            type="response.reasoning_text.done",
            item_id=self._item.id,
            output_index=self._index,
            content_index=0,
            text=self._text,
        )
        self._part_event(
            ResponseContentPartDoneEvent,
            "response.content_part.done",
            part_done.PartReasoningText(type="reasoning_text", text=self._text),
        )
        self._item.content = [Content(type="reasoning_text", text=self._text)]
        self._item.status = status
        self._item_done()

    def open_call(self, name: str) -> None:
        self.close()
        self._add(
            ResponseFunctionToolCall(
                type="function_call",
                id=new_id("fc"),
                call_id=new_id("call"),
                name=name,
                arguments="",
                status="in_progress",
            )
        )

    def arguments_delta(self, text: str) -> None:
        self._item.arguments += text
        self._send(
            ResponseFunctionCallArgumentsDeltaEvent,
            type="response.function_call_arguments.delta",
            item_id=self._item.id,
            output_index=self._index,
            delta=text,
        )

    def close_call(self, arguments: str, status: ItemStatus) -> None:
        self._item.arguments = arguments
        self._send(
            ResponseFunctionCallArgumentsDoneEvent,
            type="response.function_call_arguments.done",
            item_id=self._item.id,
            output_index=self._index,
            arguments=arguments,
        )
        self._item.status = status
        self._item_done()
