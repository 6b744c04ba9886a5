"""Fold Responses stream events into a Response-shaped state.

The openai SDK's accumulator covers only text and function-call deltas and raises on
identities it does not expect; the view must render every item type, reasoning and logprobs,
and must never crash on traffic from newer APIs. So this folder works on plain dicts: each
event updates ``state`` at once (Python stays authoritative) and records the same change in a
:class:`PatchBuffer` for the front end.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

from nbresponses.traffic.events import NON_TERMINAL, TERMINAL

from ._plain import clone, fields, plain
from .patches import PatchBuffer

# Status events of hosted tool calls: event type prefix -> item status is the last word.
_TOOL_STATUS_PREFIXES = (
    "response.web_search_call.",
    "response.file_search_call.",
    "response.code_interpreter_call.",
    "response.image_generation_call.",
    "response.mcp_call.",
    "response.mcp_list_tools.",
)
# Known events whose payload the view does not render (audio bytes, partial images).
_IGNORED = {
    "response.audio.delta",
    "response.audio.done",
    "response.image_generation_call.partial_image",
}
_MAX_UNKNOWN = 50
_MAX_GENERIC_CHARS = 2_000


def empty_state(cancellable: bool = False) -> dict[str, Any]:
    """The state before any event: a Response skeleton and the view's own bookkeeping."""
    return {
        "response": {
            "id": None,
            "object": "response",
            "status": None,
            "model": None,
            "output": [],
            "usage": None,
            "error": None,
            "incomplete_details": None,
        },
        "view": {
            "phase": "waiting",  # waiting | streaming | done
            "interrupted": False,
            "cancellable": cancellable,
            "cancelled": False,
            "exception": None,
            "errors": [],
            "unknown": [],
            "unknown_count": 0,
            "events": 0,
            "items": [],
            "timing": {"ttft": None, "generation": None, "wall": None, "elapsed": 0.0},
        },
    }


def _generic(event: Any) -> str:
    """A short JSON rendering of anything, for events and fields the view does not know."""
    try:
        text = json.dumps(plain(event), ensure_ascii=False, default=str)
    except Exception as exc:  # a broken object must not break the view
        text = f"<unprintable {type(event).__name__}: {exc}>"
    return text if len(text) <= _MAX_GENERIC_CHARS else text[:_MAX_GENERIC_CHARS] + "…"


class Folder:
    """Applies events to ``state`` and records the changes in ``patches``."""

    def __init__(
        self,
        state: dict[str, Any] | None = None,
        patches: PatchBuffer | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.state = state if state is not None else empty_state()
        self.patches = patches if patches is not None else PatchBuffer()
        self._clock = clock
        self._t0 = clock()
        self._first_token: float | None = None
        self._last_token: float | None = None
        self._deltas: list[int] = []  # per output index, sent at flush time
        self._deltas_sent: list[int] = []
        self.terminal: str | None = None
        self._handlers: dict[str, Callable[[dict[str, Any], str], None]] = {
            "response.output_text.delta": self._text_delta,
            "response.reasoning_summary_text.delta": self._summary_delta,
            "response.reasoning_text.delta": self._reasoning_text_delta,
            "response.function_call_arguments.delta": self._field_delta(
                "function_call", "arguments"
            ),
            "response.code_interpreter_call_code.delta": self._field_delta(
                "code_interpreter_call", "code"
            ),
            "response.custom_tool_call_input.delta": self._field_delta("custom_tool_call", "input"),
            "response.mcp_call_arguments.delta": self._field_delta("mcp_call", "arguments"),
            "response.refusal.delta": self._refusal_delta,
            "response.output_item.added": self._item_added,
            "response.output_item.done": self._item_done,
            "response.content_part.added": self._part_added,
            "response.content_part.done": self._part_done,
            "response.output_text.done": self._text_done,
            "response.output_text.annotation.added": self._annotation_added,
            "response.refusal.done": self._field_done_in_part("refusal"),
            "response.reasoning_summary_part.added": self._summary_part,
            "response.reasoning_summary_part.done": self._summary_part,
            "response.reasoning_summary_text.done": self._summary_text_done,
            "response.reasoning_text.done": self._reasoning_text_done,
            "response.function_call_arguments.done": self._field_done("function_call", "arguments"),
            "response.code_interpreter_call_code.done": self._field_done(
                "code_interpreter_call", "code"
            ),
            "response.custom_tool_call_input.done": self._field_done("custom_tool_call", "input"),
            "response.mcp_call_arguments.done": self._field_done("mcp_call", "arguments"),
            "error": self._error,
        }
        for kind in NON_TERMINAL:
            self._handlers[kind] = self._lifecycle
        for kind in TERMINAL:
            self._handlers[kind] = self._terminal

    # ------------------------------------------------------------------ entry points

    def apply(self, event: Any) -> None:
        """Fold one event (a dict or an SDK model); never raises on odd input."""
        view = self.state["view"]
        view["events"] += 1
        try:
            ev = fields(event)
            kind = ev.get("type")
            handler = self._handlers.get(kind)  # type: ignore[arg-type]
            if handler is not None:
                if view["phase"] == "waiting":
                    self._set(["view", "phase"], "streaming")
                handler(ev, kind)  # type: ignore[arg-type]
            elif isinstance(kind, str) and kind.startswith(_TOOL_STATUS_PREFIXES):
                self._tool_status(ev, kind)
            elif kind not in _IGNORED:
                self._unknown(event, "unknown event type")
        except Exception as exc:  # the view shows what it could not fold and carries on
            self._unknown(event, f"{type(exc).__name__}: {exc}")

    def load_response(self, response: Any) -> None:
        """Take a finished Response (model or dict) as the whole state."""
        data = plain(response)
        if not isinstance(data, dict):
            raise TypeError(f"not a Response: {type(response).__name__}")
        self._replace_response(data)
        self.terminal = data.get("status") or "completed"

    def elapsed(self) -> float:
        """Seconds since the folder was made."""
        return self._clock() - self._t0

    def flush_derived(self) -> None:
        """Record the counters that change on every event (sent once per flush, not per event)."""
        view = self.state["view"]
        for index, count in enumerate(self._deltas):
            if index >= len(self._deltas_sent):
                self._deltas_sent.append(0)
            if count != self._deltas_sent[index] and index < len(view["items"]):
                self._deltas_sent[index] = count
                self._set(["view", "items", index, "deltas"], count)
        self._set(["view", "timing", "elapsed"], round(self.elapsed(), 3))
        self.patches.set(["view", "events"], view["events"])

    def finish(self, *, interrupted: bool = False, measured: bool = True) -> None:
        """Stamp the end of the stream: timings, phase and whether it ended early.

        ``measured=False`` (a finished Response, a list of recorded events): the clock here
        timed only the folding, so it shows no first-token time, speed or wall time of its
        own (they read 0.00 s and ten million tok/s); the wall time is the Response's own,
        ``completed_at - created_at``, when it has both."""
        now = self.elapsed()
        timing = dict(self.state["view"]["timing"])
        timing["wall"] = round(now, 4)
        timing["elapsed"] = round(now, 4)
        if self._first_token is not None and self._last_token is not None:
            timing["generation"] = round(self._last_token - self._first_token, 4)
        if not measured:
            response = self.state["response"]
            start, end = response.get("created_at"), response.get("completed_at")
            timing = {}
            if isinstance(start, int | float) and isinstance(end, int | float) and end >= start:
                timing["wall"] = round(end - start, 4)
        self.flush_derived()
        self._set(["view", "timing"], timing)
        if interrupted:
            self._set(["view", "interrupted"], True)
        self._set(["view", "phase"], "done")

    def mark_cancelled(self, final: dict[str, Any] | None = None) -> None:
        """The reader stopped the stream: the view says so, and the response is cancelled
        unless a terminal event already said how it ended. ``final``: the Response the
        source's cancel returned (a stream with no terminal event for cancel, as OpenAI's and
        the engine's): its status, usage and error are taken."""
        self._set(["view", "cancelled"], True)
        if self.terminal is not None:
            return
        final = final if isinstance(final, dict) and final.get("object") == "response" else {}
        self._set(["response", "status"], final.get("status") or "cancelled")
        for key in ("usage", "error", "incomplete_details"):
            if final.get(key) is not None:
                self._set(["response", key], final[key])

    def record_exception(self, exc: BaseException) -> None:
        """The source raised while being read: shown in place of the missing end."""
        self._set(["view", "exception"], {"type": type(exc).__name__, "message": str(exc)})

    def record_error(self, message: str) -> None:
        """An error the reader met (a failing cancel hook), listed with the stream's errors."""
        self._error({"message": message}, "error")

    # ------------------------------------------------------------------ state helpers

    def _set(self, path: list[str | int], value: Any) -> None:
        target: Any = self.state
        for key in path[:-1]:
            target = target[key]
        last = path[-1]
        if isinstance(target, list) and last == len(target):
            target.append(value)
        else:
            target[last] = value
        self.patches.set(path, clone(value))

    def _replace_item(self, index: int, item: dict[str, Any]) -> None:
        """Make output item ``index`` equal ``item``, sending only what differs from what
        streamed: a finished item repeats its whole text and logprobs (13 MB of patch for a
        100,000-token answer with two alternatives per token)."""
        path: list[str | int] = ["response", "output", index]
        old = self.state["response"]["output"][index]
        if not isinstance(old, dict) or old.keys() - item.keys():
            self._set(path, item)  # no operation deletes a field: replace it whole
            return
        for key, value in item.items():
            if key in old and old[key] == value:
                continue
            before = old.get(key)
            if (
                key in ("content", "summary")
                and isinstance(value, list)
                and isinstance(before, list)
                and len(value) == len(before)
            ):
                for j, (a, b) in enumerate(zip(before, value, strict=True)):
                    if a == b:
                        continue
                    if isinstance(a, dict) and isinstance(b, dict) and not a.keys() - b.keys():
                        for k, v in b.items():
                            if k not in a or a[k] != v:
                                self._set([*path, key, j, k], v)
                    else:
                        self._set([*path, key, j], b)
            else:
                self._set([*path, key], value)

    def _meta(self, index: int) -> dict[str, Any]:
        items = self.state["view"]["items"]
        while len(items) <= index:
            self._set(["view", "items", len(items)], {"t0": None, "t1": None, "deltas": 0})
            self._deltas.append(0)
        return items[index]

    def _item(self, ev: dict[str, Any], default_type: str) -> tuple[int, dict[str, Any]]:
        """The output item an event refers to, created if its ``added`` event was missing."""
        index = ev.get("output_index")
        if not isinstance(index, int) or index < 0:
            index = self._index_of(ev.get("item_id"))
        output = self.state["response"]["output"]
        while len(output) < index:
            self._set(["response", "output", len(output)], None)
        if index == len(output) or output[index] is None:
            item = {"type": default_type, "id": ev.get("item_id")}
            self._set(["response", "output", index], item)
            self._started(index)
        return index, output[index]

    def _index_of(self, item_id: Any) -> int:
        output = self.state["response"]["output"]
        for index, item in enumerate(output):
            if item is not None and item_id is not None and item.get("id") == item_id:
                return index
        return len(output)

    def _part(
        self, index: int, item: dict[str, Any], key: str, pos: Any, default: dict[str, Any]
    ) -> dict[str, Any]:
        """``item[key][pos]``, created (with earlier gaps filled) when it is missing."""
        if not isinstance(pos, int) or pos < 0:
            pos = 0
        parts = item.get(key)
        if not isinstance(parts, list):
            self._set(["response", "output", index, key], [])
            parts = item[key]
        while len(parts) <= pos:
            self._set(["response", "output", index, key, len(parts)], plain(default))
        return parts[pos]

    def _started(self, index: int) -> None:
        meta = self._meta(index)
        if meta["t0"] is None:
            self._set(["view", "items", index, "t0"], round(self.elapsed(), 4))

    def _token(self, index: int) -> None:
        now = self._clock()
        if self._first_token is None:
            self._first_token = now
            self._set(["view", "timing", "ttft"], round(now - self._t0, 4))
        self._last_token = now
        self._deltas[index] += 1

    # ------------------------------------------------------------------ deltas (hot path)

    def _text_delta(self, ev: dict[str, Any], kind: str) -> None:
        index, item = self._item(ev, "message")
        ci = ev.get("content_index", 0)
        part = self._part(index, item, "content", ci, _TEXT_PART)
        path = ["response", "output", index, "content", ci]
        delta = ev.get("delta") or ""
        part["text"] = (part.get("text") or "") + delta
        self.patches.append([*path, "text"], delta)
        logprobs = ev.get("logprobs")
        if logprobs:
            values = plain(logprobs)
            if not isinstance(part.get("logprobs"), list):
                self._set([*path, "logprobs"], [])
            part["logprobs"].extend(values)
            self.patches.extend([*path, "logprobs"], values)
        self._token(index)

    def _summary_delta(self, ev: dict[str, Any], kind: str) -> None:
        index, item = self._item(ev, "reasoning")
        si = ev.get("summary_index", 0)
        part = self._part(index, item, "summary", si, _SUMMARY_PART)
        self._append_text(index, part, ["summary", si, "text"], ev.get("delta") or "")

    def _reasoning_text_delta(self, ev: dict[str, Any], kind: str) -> None:
        index, item = self._item(ev, "reasoning")
        ci = ev.get("content_index", 0)
        part = self._part(index, item, "content", ci, _REASONING_PART)
        self._append_text(index, part, ["content", ci, "text"], ev.get("delta") or "")

    def _refusal_delta(self, ev: dict[str, Any], kind: str) -> None:
        index, item = self._item(ev, "message")
        ci = ev.get("content_index", 0)
        part = self._part(index, item, "content", ci, _REFUSAL_PART)
        self._append_text(index, part, ["content", ci, "refusal"], ev.get("delta") or "")

    def _append_text(self, index: int, holder: dict[str, Any], rel: list[Any], delta: str) -> None:
        key = rel[-1]
        holder[key] = (holder.get(key) or "") + delta
        self.patches.append(["response", "output", index, *rel], delta)
        self._token(index)

    def _field_delta(self, item_type: str, key: str) -> Callable[[dict[str, Any], str], None]:
        def handle(ev: dict[str, Any], kind: str) -> None:
            index, item = self._item(ev, item_type)
            self._append_text(index, item, [key], ev.get("delta") or "")

        return handle

    # ------------------------------------------------------------------ structure

    def _item_added(self, ev: dict[str, Any], kind: str) -> None:
        item = plain(ev.get("item")) or {}
        index, _ = self._item(ev, item.get("type") or "unknown")
        self._set(["response", "output", index], item)
        self._started(index)

    def _item_done(self, ev: dict[str, Any], kind: str) -> None:
        item = plain(ev.get("item")) or {}
        index, old = self._item(ev, item.get("type") or "unknown")
        _keep_logprobs(old, item)
        self._replace_item(index, item)
        meta = self._meta(index)
        self._set(["view", "items", index, "t1"], round(self.elapsed(), 4))
        if meta["t0"] is None:
            self._set(["view", "items", index, "t0"], meta["t1"])

    def _part_added(self, ev: dict[str, Any], kind: str) -> None:
        part = plain(ev.get("part")) or {}
        default = "reasoning" if part.get("type") == "reasoning_text" else "message"
        index, item = self._item(ev, default)
        ci = ev.get("content_index", 0)
        self._part(index, item, "content", ci, part)
        self._set(["response", "output", index, "content", ci], part)

    def _part_done(self, ev: dict[str, Any], kind: str) -> None:
        part = plain(ev.get("part")) or {}
        default = "reasoning" if part.get("type") == "reasoning_text" else "message"
        index, item = self._item(ev, default)
        ci = ev.get("content_index", 0)
        old = self._part(index, item, "content", ci, part)
        if old.get("logprobs") and not part.get("logprobs"):
            part["logprobs"] = old["logprobs"]
        if old != part:
            self._set(["response", "output", index, "content", ci], part)

    def _text_done(self, ev: dict[str, Any], kind: str) -> None:
        index, item = self._item(ev, "message")
        ci = ev.get("content_index", 0)
        part = self._part_text_done(ev, index, item, "content", ci, _TEXT_PART)
        logprobs = ev.get("logprobs")
        if logprobs and not part.get("logprobs"):
            self._set(["response", "output", index, "content", ci, "logprobs"], plain(logprobs))

    def _part_text_done(
        self,
        ev: dict[str, Any],
        index: int,
        item: dict[str, Any],
        holder: str,
        position: int,
        template: dict[str, Any],
    ) -> dict[str, Any]:
        """A ``*.done`` event's full text replaces what the deltas built, if it differs."""
        part = self._part(index, item, holder, position, template)
        text = ev.get("text")
        if isinstance(text, str) and text != part.get("text"):
            self._set(["response", "output", index, holder, position, "text"], text)
        return part

    def _annotation_added(self, ev: dict[str, Any], kind: str) -> None:
        index, item = self._item(ev, "message")
        ci = ev.get("content_index", 0)
        part = self._part(index, item, "content", ci, _TEXT_PART)
        annotation = plain(ev.get("annotation"))
        if not isinstance(part.get("annotations"), list):
            self._set(["response", "output", index, "content", ci, "annotations"], [])
        part["annotations"].append(annotation)
        self.patches.extend(
            ["response", "output", index, "content", ci, "annotations"], [annotation]
        )

    def _summary_part(self, ev: dict[str, Any], kind: str) -> None:
        index, item = self._item(ev, "reasoning")
        si = ev.get("summary_index", 0)
        part = plain(ev.get("part")) or dict(_SUMMARY_PART)
        old = self._part(index, item, "summary", si, part)
        if old != part and (part.get("text") or not old.get("text")):
            self._set(["response", "output", index, "summary", si], part)

    def _summary_text_done(self, ev: dict[str, Any], kind: str) -> None:
        index, item = self._item(ev, "reasoning")
        si = ev.get("summary_index", 0)
        self._part_text_done(ev, index, item, "summary", si, _SUMMARY_PART)

    def _reasoning_text_done(self, ev: dict[str, Any], kind: str) -> None:
        index, item = self._item(ev, "reasoning")
        ci = ev.get("content_index", 0)
        self._part_text_done(ev, index, item, "content", ci, _REASONING_PART)

    def _field_done(self, item_type: str, key: str) -> Callable[[dict[str, Any], str], None]:
        def handle(ev: dict[str, Any], kind: str) -> None:
            index, item = self._item(ev, item_type)
            value = ev.get(key)
            if isinstance(value, str) and value != item.get(key):
                self._set(["response", "output", index, key], value)

        return handle

    def _field_done_in_part(self, key: str) -> Callable[[dict[str, Any], str], None]:
        def handle(ev: dict[str, Any], kind: str) -> None:
            index, item = self._item(ev, "message")
            ci = ev.get("content_index", 0)
            part = self._part(index, item, "content", ci, _REFUSAL_PART)
            value = ev.get(key)
            if isinstance(value, str) and value != part.get(key):
                self._set(["response", "output", index, "content", ci, key], value)

        return handle

    def _tool_status(self, ev: dict[str, Any], kind: str) -> None:
        prefix, _, status = kind.rpartition(".")
        item_type = prefix.removeprefix("response.")
        index, item = self._item(ev, item_type)
        if item.get("status") != status:
            self._set(["response", "output", index, "status"], status)

    # ------------------------------------------------------------------ lifecycle

    def _lifecycle(self, ev: dict[str, Any], kind: str) -> None:
        response = plain(ev.get("response")) or {}
        current = self.state["response"]
        if current.get("id") and response.get("id") and response["id"] != current["id"]:
            self._restart()
            current = self.state["response"]
        for key, value in response.items():
            if key == "output" and not value:
                continue
            if current.get(key) != value:
                self._set(["response", key], value)

    def _terminal(self, ev: dict[str, Any], kind: str) -> None:
        response = plain(ev.get("response")) or {}
        current = self.state["response"]
        output = response.get("output")
        if not output and any(item is not None for item in current["output"]):
            response["output"] = current["output"]
        elif isinstance(output, list):
            _keep_all_logprobs(current["output"], output)
        response.setdefault("status", TERMINAL[kind])
        self._update_response(response)
        self.terminal = TERMINAL[kind]

    def _update_response(self, response: dict[str, Any]) -> None:
        """Record only what the final response changes: usually status and usage, not the
        (already streamed) output, which would otherwise be copied and sent a second time."""
        current = self.state["response"]
        for key, value in response.items():
            if key != "output" and current.get(key) != value:
                self._set(["response", key], value)
        output = response.get("output")
        if not isinstance(output, list):
            return
        if len(output) != len(current["output"]):
            self._set(["response", "output"], output)
        else:
            for index, item in enumerate(output):
                if current["output"][index] != item:
                    self._replace_item(index, item)
        for index in range(len(output)):
            self._meta(index)

    def _replace_response(self, response: dict[str, Any]) -> None:
        response.setdefault("output", [])
        if not isinstance(response["output"], list):
            response["output"] = []
        self._set(["response"], response)
        for index in range(len(response["output"])):
            self._meta(index)

    def _restart(self) -> None:
        """A new response id in the same stream (a tool loop's next turn): start over."""
        fresh = empty_state(self.state["view"]["cancellable"])
        fresh["view"]["events"] = self.state["view"]["events"]
        fresh["view"]["phase"] = "streaming"
        self.state["response"] = fresh["response"]
        self.state["view"]["items"] = []
        self._deltas = []
        self._deltas_sent = []
        self.terminal = None
        self.patches.set(["response"], plain(fresh["response"]))
        self.patches.set(["view", "items"], [])

    def _error(self, ev: dict[str, Any], kind: str) -> None:
        error = ev.get("error")
        body = plain(error) if isinstance(error, dict) or hasattr(error, "model_dump") else {}
        entry = {
            "code": ev.get("code") or body.get("code"),
            "message": ev.get("message") or body.get("message") or _generic(ev),
            "param": ev.get("param") or body.get("param"),
        }
        self.state["view"]["errors"].append(entry)
        self.patches.extend(["view", "errors"], [entry])

    def _unknown(self, event: Any, reason: str) -> None:
        view = self.state["view"]
        view["unknown_count"] += 1
        self.patches.set(["view", "unknown_count"], view["unknown_count"])
        if len(view["unknown"]) < _MAX_UNKNOWN:
            try:
                kind = fields(event).get("type")
            except Exception:
                kind = None
            entry = {"type": str(kind), "reason": reason, "data": _generic(event)}
            view["unknown"].append(entry)
            self.patches.extend(["view", "unknown"], [entry])


_TEXT_PART = {"type": "output_text", "text": "", "annotations": []}
_REFUSAL_PART = {"type": "refusal", "refusal": ""}
_SUMMARY_PART = {"type": "summary_text", "text": ""}
_REASONING_PART = {"type": "reasoning_text", "text": ""}


def _keep_logprobs(old: Any, new: dict[str, Any]) -> None:
    """Streamed logprobs survive a ``done`` item that leaves them out."""
    if not isinstance(old, dict) or old.get("type") != "message":
        return
    old_parts, new_parts = old.get("content") or [], new.get("content")
    if not isinstance(new_parts, list):
        return
    for old_part, new_part in zip(old_parts, new_parts, strict=False):
        if (
            isinstance(old_part, dict)
            and isinstance(new_part, dict)
            and old_part.get("logprobs")
            and not new_part.get("logprobs")
        ):
            new_part["logprobs"] = old_part["logprobs"]


def _keep_all_logprobs(old: list[Any], new: list[Any]) -> None:
    for old_item, new_item in zip(old, new, strict=False):
        if isinstance(new_item, dict):
            _keep_logprobs(old_item, new_item)
