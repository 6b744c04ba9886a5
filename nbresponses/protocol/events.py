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
    ResponseCodeInterpreterCallCodeDeltaEvent,
    ResponseCodeInterpreterCallCodeDoneEvent,
    ResponseCodeInterpreterCallCompletedEvent,
    ResponseCodeInterpreterCallInProgressEvent,
    ResponseCodeInterpreterCallInterpretingEvent,
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
    ResponseWebSearchCallCompletedEvent,
    ResponseWebSearchCallInProgressEvent,
    ResponseWebSearchCallSearchingEvent,
)
from openai.types.responses import response_content_part_added_event as part_added
from openai.types.responses import response_content_part_done_event as part_done
from openai.types.responses import response_output_text as output_text
from openai.types.responses import response_text_delta_event as text_delta
from openai.types.responses import response_text_done_event as text_done
from openai.types.responses.response import IncompleteDetails
from openai.types.responses.response_reasoning_item import Content

from nbresponses.protocol.ids import new_id
from nbresponses.tools import registry

ItemStatus = Literal["completed", "incomplete"]
ToolStatus = Literal["completed", "incomplete", "failed"]
Phase = Literal["commentary", "final_answer"]
Terminal = Literal["completed", "incomplete", "failed", "cancelled"]


@dataclass(frozen=True)
class TokenLogprob:
    """One generated token's logprob in protocol terms (display string, bytes, alternatives).

    ``processed_logprob`` (vLLM's ``logprobs_mode="processed_logprobs"``): the token's logprob
    under the distribution it was drawn from, sent as an extra field of OpenAI's logprob
    objects beside the raw ``logprob`` (the SDK's types keep extra fields)."""

    token: str
    bytes: list[int]
    logprob: float
    top: list[tuple[str, list[int], float]]
    processed_logprob: float | None = None

    def _extra(self) -> dict[str, Any]:
        processed = self.processed_logprob
        return {} if processed is None else {"processed_logprob": processed}

    def for_output(self) -> output_text.Logprob:
        tops = [output_text.LogprobTopLogprob(token=t, bytes=b, logprob=v) for t, b, v in self.top]
        return output_text.Logprob(
            token=self.token,
            bytes=self.bytes,
            logprob=self.logprob,
            top_logprobs=tops,
            **self._extra(),
        )

    def for_delta(self) -> text_delta.Logprob:
        tops = [text_delta.LogprobTopLogprob(token=t, logprob=v) for t, _, v in self.top]
        return text_delta.Logprob(
            token=self.token, logprob=self.logprob, top_logprobs=tops, **self._extra()
        )

    def for_done(self) -> text_done.Logprob:
        tops = [text_done.LogprobTopLogprob(token=t, logprob=v) for t, _, v in self.top]
        return text_done.Logprob(
            token=self.token, logprob=self.logprob, top_logprobs=tops, **self._extra()
        )


class EventBuilder:
    """Builds one response's events; ``emit`` receives each event as it is made."""

    def __init__(self, response: Response, emit: Callable[[ResponseStreamEvent], None]) -> None:
        self.response = response
        self._emit = emit
        self._seq = 0
        self._item: Any = None  # the open output item
        self._text = ""
        self._logprobs: list[TokenLogprob] = []
        self._input_done = False  # the open tool call's input-done event went out

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
        self._input_done = False
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
        self._text = ""
        self._logprobs = []  # a stored response keeps only its items

    @property
    def current(self) -> Any:
        """The open output item (the live object in ``response.output``), or None."""
        return self._item

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
        """End what is open and emit the terminal event (none for cancelled: OpenAI has none)."""
        self.end_item(status="completed" if status == "completed" else "incomplete")
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

    def end_item(self, status: ItemStatus = "completed") -> None:
        """Finish the open item (if any) with the given status."""
        if self._item is None:
            return
        kind = self._item.type
        if kind == "message":
            self._end_message(status)
        elif kind == "reasoning":
            self._end_reasoning(status)
        elif kind in TOOL_EVENTS:
            self.end_tool(status)
        else:
            self.end_call(self._item.arguments, status)

    def open_message(self, phase: Phase | None = None) -> None:
        """A new assistant message; ``phase`` labels harmony's commentary vs final answers."""
        self.end_item()
        message = ResponseOutputMessage(
            type="message", id=new_id("msg"), role="assistant", status="in_progress", content=[]
        )
        if phase is not None:
            message.phase = phase
        self._add(message)
        part = ResponseOutputText(type="output_text", text="", annotations=[], logprobs=[])
        self._item.content.append(part)
        self._part_event(ResponseContentPartAddedEvent, "response.content_part.added", part)

    def _item_event(self, cls: type, kind: str, **fields: Any) -> None:
        """An event about the open item (its id and output index filled in)."""
        self._send(cls, type=kind, item_id=self._item.id, output_index=self._index, **fields)

    def _content_event(self, cls: type, kind: str, **fields: Any) -> None:
        """An event about the open item's (one) content part."""
        self._item_event(cls, kind, content_index=0, **fields)

    def _part_event(self, cls: type, kind: str, part: Any) -> None:
        self._content_event(cls, kind, part=part.model_copy(deep=True))

    def text_delta(self, text: str, logprobs: list[TokenLogprob]) -> None:
        part = self._item.content[0]
        part.text += text
        part.logprobs = [*(part.logprobs or []), *(lp.for_output() for lp in logprobs)]
        self._logprobs.extend(logprobs)
        self._content_event(
            ResponseTextDeltaEvent,
            "response.output_text.delta",
            delta=text,
            logprobs=[lp.for_delta() for lp in logprobs],
        )

    def _end_message(self, status: ItemStatus) -> None:
        part = self._item.content[0]
        self._content_event(
            ResponseTextDoneEvent,
            "response.output_text.done",
            text=part.text,
            logprobs=[lp.for_done() for lp in self._logprobs],
        )
        self._part_event(ResponseContentPartDoneEvent, "response.content_part.done", part)
        self._item.status = status
        self._item_done()

    def open_reasoning(self) -> None:
        self.end_item()
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
        self._content_event(
            ResponseReasoningTextDeltaEvent, "response.reasoning_text.delta", delta=text
        )

    def _end_reasoning(self, status: ItemStatus) -> None:
        self._content_event(
            ResponseReasoningTextDoneEvent, "response.reasoning_text.done", text=self._text
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
        self.end_item()
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
        self._item_event(
            ResponseFunctionCallArgumentsDeltaEvent,
            "response.function_call_arguments.delta",
            delta=text,
        )

    def end_call(self, arguments: str, status: ItemStatus) -> None:
        self._item.arguments = arguments
        self._item_event(
            ResponseFunctionCallArgumentsDoneEvent,
            "response.function_call_arguments.done",
            arguments=arguments,
        )
        self._item.status = status
        self._item_done()

    # -- built-in tools (gpt-oss) --------------------------------------------------------

    def _tool_event(self, event: tuple[type, str], **fields: Any) -> None:
        self._item_event(*event, **fields)

    def open_tool(self, kind: str, fields: dict[str, Any]) -> None:
        """A built-in tool call's item (``kind``: its item type; ``fields``: what the tool
        says the item holds when it opens: code, container, action...)."""
        self.end_item()
        tool = registry.for_item_type(kind)
        assert tool is not None, f"no built-in tool makes {kind!r} items"
        item = {"type": kind, "id": new_id(tool.id_prefix), "status": "in_progress", **fields}
        self._add(tool.item_class.model_validate(item))
        self._tool_event(TOOL_EVENTS[kind].in_progress)

    def tool_input_delta(self, text: str) -> None:
        """More of the call's input (a code interpreter call's code) as it streams."""
        spec = TOOL_EVENTS[self._item.type]
        assert spec.input_delta is not None, f"{self._item.type} streams no input"
        setattr(self._item, spec.input_field, getattr(self._item, spec.input_field) + text)
        self._tool_event(spec.input_delta, delta=text)

    def tool_input_done(self) -> None:
        """The call's input is complete (the item stays open until the call has run)."""
        spec = TOOL_EVENTS[self._item.type]
        if self._input_done or spec.input_done is None:
            return
        self._input_done = True
        self._tool_event(
            spec.input_done, **{spec.input_field: getattr(self._item, spec.input_field)}
        )

    def tool_running(self) -> None:
        """The call runs now (python interprets, the browser searches)."""
        self.tool_input_done()
        spec = TOOL_EVENTS[self._item.type]
        self._item.status = spec.running_status
        self._tool_event(spec.running)

    def end_tool(self, status: ToolStatus, fields: dict[str, Any] | None = None) -> None:
        """Finish the call: "completed" when it ran, else "failed" or never run ("incomplete");
        ``fields`` (the tool's answer: outputs, the action with its URL) update the item."""
        self.tool_input_done()
        if fields:
            merged = {**self._item.model_dump(by_alias=True), **fields}
            updated = type(self._item).model_validate(merged)
            for name in fields:
                setattr(self._item, name, getattr(updated, name))
        if status == "completed":
            self._tool_event(TOOL_EVENTS[self._item.type].completed)
        self._item.status = status
        self._item_done()


@dataclass(frozen=True)
class ToolEvents:
    """The stream events of one built-in tool item type (OpenAI's names and classes)."""

    in_progress: tuple[type, str]
    running: tuple[type, str]
    completed: tuple[type, str]
    running_status: str
    input_field: str = ""  # the item field the call's input streams into
    input_delta: tuple[type, str] | None = None
    input_done: tuple[type, str] | None = None


TOOL_EVENTS: dict[str, ToolEvents] = {
    "code_interpreter_call": ToolEvents(
        in_progress=(
            ResponseCodeInterpreterCallInProgressEvent,
            "response.code_interpreter_call.in_progress",
        ),
        running=(
            ResponseCodeInterpreterCallInterpretingEvent,
            "response.code_interpreter_call.interpreting",
        ),
        completed=(
            ResponseCodeInterpreterCallCompletedEvent,
            "response.code_interpreter_call.completed",
        ),
        running_status="interpreting",
        input_field="code",
        input_delta=(
            ResponseCodeInterpreterCallCodeDeltaEvent,
            "response.code_interpreter_call_code.delta",
        ),
        input_done=(
            ResponseCodeInterpreterCallCodeDoneEvent,
            "response.code_interpreter_call_code.done",
        ),
    ),
    "web_search_call": ToolEvents(
        in_progress=(ResponseWebSearchCallInProgressEvent, "response.web_search_call.in_progress"),
        running=(ResponseWebSearchCallSearchingEvent, "response.web_search_call.searching"),
        completed=(ResponseWebSearchCallCompletedEvent, "response.web_search_call.completed"),
        running_status="searching",
    ),
}
