"""Read Chat Completions and legacy Completions traffic as the Responses stream of one answer.

One reading of each shape, shared by ``view/`` (which folds events) and ``frames/`` (which
read a Response's parts): a ``ChatCompletion``, a ``Completion``, or a stream of their chunks
(SDK objects or JSON dicts, from OpenAI, vLLM, DeepSeek, OpenRouter or nbresponses) becomes
the events a Responses stream of the same answer carries, ending with the terminal snapshot.
So a frame or a view of an answer is the same whichever API produced it.

The output keeps the Responses layout: a ``reasoning`` item first when the server streams the
model's thinking (``reasoning_content``: vLLM, DeepSeek; ``reasoning``: OpenRouter, newer
vLLM), then the ``message`` (its ``output_text`` part, a ``refusal`` part after it), then one
``function_call`` per tool call in the order of their ``index``. Token logprobs ride on the text
deltas as Responses logprobs do (Chat's entries already have their shape, ``bytes``
included); refusal logprobs are kept on the refusal part. ``finish_reason`` gives the status
(``length``: incomplete, ``max_output_tokens``; ``content_filter``: incomplete too) and the
usage is read wherever a server puts it (a ``choices: []`` chunk, the finish chunk, a chunk
after it). An ``error`` in a chunk (OpenRouter sends one inside a 200 stream) fails the
response. Only one choice is read (``choice``, default 0): ``n > 1`` answers are one response
each.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from .access import field, kind_of
from .legacy import echoed_prompt, legacy_entries, mark_prompt, prompt_entries, trim_alternatives

__all__ = [
    "CHAT",
    "CHUNK",
    "TEXT",
    "ChoiceReader",
    "EventReader",
    "as_events",
    "as_response",
    "chunk_of",
    "error_response",
    "is_error_body",
    "shape_of",
    "usage_of",
]

CHAT = "chat.completion"
CHUNK = "chat.completion.chunk"
TEXT = "text_completion"  # a Completion and each chunk of its stream alike
SHAPES = frozenset((CHAT, CHUNK, TEXT))

_STATUS = {
    "length": ("incomplete", "max_output_tokens"),
    "content_filter": ("incomplete", "content_filter"),
}


def shape_of(obj: Any) -> str | None:
    """``"chat.completion"``, ``"chat.completion.chunk"``, ``"text_completion"`` or None."""
    if isinstance(obj, (str, bytes)):
        return None
    kind = field(obj, "object")
    return kind if kind in SHAPES else None


def chunk_of(obj: Any) -> Any:
    """The chunk an SDK ``ChatCompletionStream`` event wraps (``type == "chunk"``), else obj."""
    if field(obj, "type") == "chunk" and shape_of(field(obj, "chunk")) == CHUNK:
        return field(obj, "chunk")
    return obj


def usage_of(usage: Any) -> dict[str, Any] | None:
    """A ``CompletionUsage`` as a Responses usage (details None where the server sent none)."""
    if usage is None:
        return None
    prompt = field(usage, "prompt_tokens_details")
    completion = field(usage, "completion_tokens_details")
    cached = field(prompt, "cached_tokens") if prompt is not None else None
    reasoning = field(completion, "reasoning_tokens") if completion is not None else None
    return {
        "input_tokens": field(usage, "prompt_tokens"),
        "input_tokens_details": {"cached_tokens": cached},
        "output_tokens": field(usage, "completion_tokens"),
        "output_tokens_details": {"reasoning_tokens": reasoning},
        "total_tokens": field(usage, "total_tokens"),
    }


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""


class ChoiceReader:
    """Turns the chunks of one Chat Completions or Completions stream (or one whole
    ``ChatCompletion``/``Completion``) into Responses events for choice ``choice``.

    ``feed(chunk)`` returns the events the chunk adds; ``finish()`` the ``done`` events and
    the terminal one (none when the choice never finished and no error came: an interrupted
    stream). ``streamed=False``: the object fed is a whole answer (it always ends).
    """

    def __init__(self, choice: int = 0, *, streamed: bool = True) -> None:
        if not isinstance(choice, int) or isinstance(choice, bool) or choice < 0:
            raise ValueError(f"choice= takes a choice index (0, 1, ...), not {choice!r}")
        self.choice = choice
        self.streamed = streamed
        self.header: dict[str, Any] | None = None
        self.output: list[dict[str, Any]] = []
        self.seq = 0
        self.finish_reason: str | None = None
        self.usage: Any = None
        self.error: dict[str, Any] | None = None
        self.indexes: set[int] = set()  # the choice indexes seen
        self._reasoning: int | None = None  # output index of the reasoning item
        self._message: int | None = None
        self._text: int | None = None  # content index of the output_text part
        self._refusal: int | None = None
        self._calls: dict[int, int] = {}  # tool call index -> output index
        self._chunks = 0  # chunks that carried this choice
        self._legacy = False  # a Completions answer (its alternatives hold the chosen token)

    # ------------------------------------------------------------------ events

    def _event(self, kind: str, **fields: Any) -> dict[str, Any]:
        event = {"type": kind, "sequence_number": self.seq, **fields}
        self.seq += 1
        return event

    def _snapshot(self, status: str) -> dict[str, Any]:
        return {**(self.header or {}), "status": status}

    def feed(self, chunk: Any) -> list[dict[str, Any]]:
        """The events one chunk (or whole answer) adds."""
        chunk = chunk_of(chunk)
        events: list[dict[str, Any]] = []
        if self.header is None:
            self.header = {
                "id": field(chunk, "id"),
                "object": "response",
                "created_at": field(chunk, "created"),
                "model": field(chunk, "model"),
                "output": [],
                "usage": None,
                "error": None,
                "incomplete_details": None,
            }
            events.append(self._event("response.created", response=self._snapshot("in_progress")))
        if self.header.get("model") is None and field(chunk, "model") is not None:
            self.header["model"] = field(chunk, "model")
        usage = field(chunk, "usage")
        if usage is not None:
            self.usage = usage
        for position, choice in enumerate(field(chunk, "choices", ())):
            index = field(choice, "index", position)
            self.indexes.add(index)
            if index == self.choice:
                events += self._choice(choice, chunk)
        error = field(chunk, "error")
        if error is not None:
            events += self._error(error)
        return events

    def _choice(self, choice: Any, chunk: Any) -> list[dict[str, Any]]:
        self._chunks += 1
        reason = field(choice, "finish_reason")
        if reason is not None:
            self.finish_reason = reason
        if shape_of(chunk) == TEXT:
            self._legacy = True
            return self._completion(choice, chunk)
        delta = field(choice, "delta")
        if delta is None:
            delta = field(choice, "message")
        if delta is None:
            return []
        logprobs = field(choice, "logprobs")
        events: list[dict[str, Any]] = []
        thinking = _text(field(delta, "reasoning_content")) or _text(field(delta, "reasoning"))
        if thinking:
            events += self._reasoning_delta(thinking)
        content = field(logprobs, "content") if logprobs is not None else None
        if _text(field(delta, "content")) or content:
            events += self._text_delta(_text(field(delta, "content")), list(content or ()))
        refusal = field(logprobs, "refusal") if logprobs is not None else None
        if _text(field(delta, "refusal")) or refusal:
            events += self._refusal_delta(_text(field(delta, "refusal")), list(refusal or ()))
        for position, call in enumerate(field(delta, "tool_calls", ())):
            events += self._call_delta(call, position)
        return events

    def _completion(self, choice: Any, chunk: Any) -> list[dict[str, Any]]:
        """A legacy Completions choice: text and the legacy logprobs, an echoed prompt marked."""
        entries = legacy_entries(field(choice, "logprobs"))
        prompt = field(choice, "prompt_logprobs")
        if self._chunks == 1:  # the first piece of this choice: the prompt comes here if at all
            if echoed_prompt(entries):
                mark_prompt(entries, self._prompt_count(entries, prompt, chunk), prompt)
            elif prompt:
                entries = prompt_entries(prompt) + entries
        text = _text(field(choice, "text"))
        return self._text_delta(text, entries) if text or entries else []

    def _prompt_count(self, entries: list[Any], prompt: Any, chunk: Any) -> int:
        """How many of the echoed entries are the prompt's: vLLM's ``prompt_logprobs`` says;
        a stream echoes the prompt alone in its first chunk; else the usage's prompt tokens
        (all entries when they are fewer). An answer to a batch of prompts counts all of them
        in its usage: there only ``prompt_logprobs`` or ``max_tokens=0`` split exactly."""
        if isinstance(prompt, list) and prompt:
            return min(len(prompt), len(entries))
        if self.streamed:
            return len(entries)
        usage = field(chunk, "usage")
        count = field(usage, "prompt_tokens") if usage is not None else None
        return count if isinstance(count, int) and count <= len(entries) else len(entries)

    def _error(self, error: Any) -> list[dict[str, Any]]:
        code = field(error, "code")
        self.error = {
            "code": None if code is None else str(code),
            "message": str(field(error, "message", "")),
        }
        return [
            self._event("error", code=self.error["code"], message=self.error["message"], param=None)
        ]

    # ------------------------------------------------------------------ items

    def _add_item(self, item: dict[str, Any]) -> tuple[int, list[dict[str, Any]]]:
        """Append a new (still empty) output item; its ``output_item.added`` event."""
        index = len(self.output)
        self.output.append(item)
        added = {k: list(v) if isinstance(v, list) else v for k, v in item.items()}
        return index, [self._event("response.output_item.added", output_index=index, item=added)]

    def _message_item(self) -> tuple[int, list[dict[str, Any]]]:
        if self._message is not None:
            return self._message, []
        item: dict[str, Any] = {
            "type": "message",
            "id": None,
            "role": "assistant",
            "status": "in_progress",
            "content": [],
        }
        self._message, events = self._add_item(item)
        return self._message, events

    def _part(self, kind: str) -> tuple[int, int, list[dict[str, Any]]]:
        """(output index, content index, events) of the message's ``output_text`` or
        ``refusal`` part, added when missing."""
        index, events = self._message_item()
        attr = "_text" if kind == "output_text" else "_refusal"
        ci = getattr(self, attr)
        if ci is None:
            content = self.output[index]["content"]
            ci = len(content)
            setattr(self, attr, ci)
            if kind == "output_text":
                part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
            else:
                part = {"type": "refusal", "refusal": "", "logprobs": []}
            content.append(part)
            shown = {k: v for k, v in part.items() if not (kind == "refusal" and k == "logprobs")}
            events.append(
                self._event(
                    "response.content_part.added",
                    output_index=index,
                    content_index=ci,
                    item_id=None,
                    part=dict(shown),
                )
            )
        return index, ci, events

    def _text_delta(self, text: str, entries: list[Any]) -> list[dict[str, Any]]:
        index, ci, events = self._part("output_text")
        part = self.output[index]["content"][ci]
        part["text"] += text
        part["logprobs"] += entries
        events.append(
            self._event(
                "response.output_text.delta",
                output_index=index,
                content_index=ci,
                item_id=None,
                delta=text,
                logprobs=entries,
            )
        )
        return events

    def _refusal_delta(self, text: str, entries: list[Any]) -> list[dict[str, Any]]:
        index, ci, events = self._part("refusal")
        part = self.output[index]["content"][ci]
        part["refusal"] += text
        part["logprobs"] += entries
        if text:
            events.append(
                self._event(
                    "response.refusal.delta",
                    output_index=index,
                    content_index=ci,
                    item_id=None,
                    delta=text,
                )
            )
        return events

    def _reasoning_delta(self, text: str) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []
        if self._reasoning is None:
            item: dict[str, Any] = {"type": "reasoning", "id": None, "summary": [], "content": []}
            self._reasoning, events = self._add_item(item)
            item["content"].append({"type": "reasoning_text", "text": ""})
            events.append(
                self._event(
                    "response.content_part.added",
                    output_index=self._reasoning,
                    content_index=0,
                    item_id=None,
                    part={"type": "reasoning_text", "text": ""},
                )
            )
        self.output[self._reasoning]["content"][0]["text"] += text
        events.append(
            self._event(
                "response.reasoning_text.delta",
                output_index=self._reasoning,
                content_index=0,
                item_id=None,
                delta=text,
            )
        )
        return events

    def _call_delta(self, call: Any, position: int) -> list[dict[str, Any]]:
        """A tool-call delta: the first of an index opens the call (id, name), the rest (and
        this one) add argument fragments. A whole message's calls have no index: their order."""
        key = field(call, "index", position)
        function = field(call, "function")
        name = field(function, "name") if function is not None else None
        arguments = _text(field(function, "arguments")) if function is not None else ""
        events: list[dict[str, Any]] = []
        if key not in self._calls:
            item = {
                "type": "function_call",
                "id": None,
                "call_id": field(call, "id"),
                "name": name or "",
                "arguments": "",
                "status": "in_progress",
            }
            self._calls[key], events = self._add_item(item)
        index = self._calls[key]
        item = self.output[index]
        if item["call_id"] is None and field(call, "id") is not None:
            item["call_id"] = field(call, "id")
        if name and not item["name"]:
            item["name"] = name
        if arguments:
            item["arguments"] += arguments
            events.append(
                self._event(
                    "response.function_call_arguments.delta",
                    output_index=index,
                    item_id=None,
                    delta=arguments,
                )
            )
        return events

    # ------------------------------------------------------------------ the end

    def finish(self) -> list[dict[str, Any]]:
        """The ``done`` events and the terminal event with the whole Response."""
        if self.header is None:
            return []
        if self.choice not in self.indexes and self.indexes:
            raise ValueError(
                f"choice={self.choice}, but the answer has choices {sorted(self.indexes)}"
            )
        ended = self.finish_reason is not None or self.error is not None or not self.streamed
        if not ended:
            return []  # an interrupted stream: no terminal event, as a Responses stream
        status, reason = _STATUS.get(self.finish_reason or "", ("completed", None))
        if self.error is not None:
            status, reason = "failed", None
        events = self._done_events(status)
        response = self._snapshot(status)
        response.update(
            output=self.output,
            usage=usage_of(self.usage),
            error=self.error,
            incomplete_details={"reason": reason} if reason else None,
        )
        kind = {"completed": "response.completed", "failed": "response.failed"}.get(
            status, "response.incomplete"
        )
        events.append(self._event(kind, response=response))
        return events

    def _done_events(self, status: str) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []
        item_status = "completed" if status == "completed" else "incomplete"
        if self._legacy and self._message is not None and self._text is not None:
            trim_alternatives(self.output[self._message]["content"][self._text]["logprobs"])
        for index, item in enumerate(self.output):
            common = {"output_index": index, "item_id": None}
            if item["type"] == "reasoning":
                text = item["content"][0]["text"]
                events.append(
                    self._event(
                        "response.reasoning_text.done", **common, content_index=0, text=text
                    )
                )
            elif item["type"] == "message":
                item["status"] = item_status
                for ci, part in enumerate(item["content"]):
                    if part["type"] == "output_text":
                        events.append(
                            self._event(
                                "response.output_text.done",
                                **common,
                                content_index=ci,
                                text=part["text"],
                                logprobs=part["logprobs"],
                            )
                        )
                    else:
                        events.append(
                            self._event(
                                "response.refusal.done",
                                **common,
                                content_index=ci,
                                refusal=part["refusal"],
                            )
                        )
                    events.append(
                        self._event(
                            "response.content_part.done", **common, content_index=ci, part=part
                        )
                    )
            elif item["type"] == "function_call":
                item["status"] = item_status
                events.append(
                    self._event(
                        "response.function_call_arguments.done",
                        **common,
                        arguments=item["arguments"],
                    )
                )
            events.append(self._event("response.output_item.done", output_index=index, item=item))
        return events


def is_error_body(obj: Any) -> bool:
    """An API's error body, ``{"error": {"message", "type", "param", "code"}}`` (any server)."""
    return (
        isinstance(obj, dict)
        and isinstance(obj.get("error"), dict)
        and "object" not in obj
        and "type" not in obj
    )


def error_response(body: dict[str, Any]) -> dict[str, Any]:
    """An error body as the failed Response it stands for (no id, no output)."""
    error = body["error"]
    code = error.get("code") or error.get("type")
    return {
        "id": None,
        "object": "response",
        "status": "failed",
        "model": None,
        "output": [],
        "usage": None,
        "error": {
            "code": None if code is None else str(code),
            "message": str(error.get("message", "")),
        },
        "incomplete_details": None,
    }


def as_response(obj: Any, choice: int = 0) -> dict[str, Any]:
    """A whole ``ChatCompletion`` or ``Completion`` (choice ``choice``) as a Response dict."""
    reader = ChoiceReader(choice, streamed=False)
    reader.feed(obj)
    terminal = reader.finish()[-1]
    return terminal["response"]


class EventReader:
    """Responses events for items that may be Chat Completions or Completions chunks among
    Responses events, one item at a time: chunks are read into events (a ``ChoiceReader`` per
    stream; a new id starts the next), Responses events pass as they are, and what is neither
    inside a chunk stream (the other events of the SDK's ``ChatCompletionStream``) is dropped.
    ``end()`` when the source is exhausted gives the last chunk stream's terminal events."""

    def __init__(self, choice: int = 0) -> None:
        self.choice = choice
        self._reader: ChoiceReader | None = None
        self._id: Any = None

    def feed(self, item: Any) -> list[Any]:
        item = chunk_of(item)
        if shape_of(item) not in (CHUNK, TEXT):
            if self._reader is not None and kind_of(item) == "unknown":
                return []  # the SDK's ChatCompletionStream events repeat what its chunks carry
            return [*self.end(), item]
        events = self.end() if self._reader is not None and field(item, "id") != self._id else []
        if self._reader is None:
            self._reader, self._id = ChoiceReader(self.choice), field(item, "id")
        return events + self._reader.feed(item)

    def end(self) -> list[Any]:
        reader, self._reader = self._reader, None
        return reader.finish() if reader is not None else []


def as_events(items: Iterable[Any], choice: int = 0) -> Iterator[Any]:
    """:class:`EventReader` over a whole sequence."""
    reader = EventReader(choice)
    for item in items:
        yield from reader.feed(item)
    yield from reader.end()
