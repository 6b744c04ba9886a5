"""The live Responses widget.

Python holds the authoritative state (a folded Response plus timings); the front end holds a
copy that it keeps current from coalesced patches (at most one message per
``flush_interval``), asks for a full snapshot when it mounts, and reads the final snapshot from
a synced trait so that saved widget state renders without a kernel.
"""

from __future__ import annotations

import asyncio
import contextlib
import pathlib
import uuid
from collections.abc import AsyncIterator
from typing import Any

import anywidget
import traitlets
from openai.types.responses import Response

from nbresponses.traffic.chat import (
    as_events,
    as_response,
    error_response,
    is_error_body,
    shape_of,
)
from nbresponses.traffic.recording import keep_shown, origin_of

from ._plain import plain
from .fold import Folder, empty_state
from .patches import PatchBuffer
from .response import to_response
from .sources import Hook, as_async, call_hook, cancel_hooks, classify, read_chunks
from .static_html import render_html
from .summary import status_label, usage_line

STATIC = pathlib.Path(__file__).parent / "static"


class ResponseView(anywidget.AnyWidget):
    """A Responses stream or Response, rendered live; ``await view`` gives the final Response."""

    _esm = STATIC / "widget.js"
    _css = STATIC / "widget.css"
    _snapshot = traitlets.Dict().tag(sync=True)

    def __init__(
        self,
        source: Any,
        *,
        cancel: Hook | None = None,
        flush_interval: float = 0.05,
        record: bool = False,
        choice: int = 0,
        input: Any = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        if not isinstance(choice, int) or isinstance(choice, bool) or choice < 0:
            raise ValueError(f"choice= takes a choice index (0, 1, ...), not {choice!r}")
        self._record = record  # keep the finished response in the history (``keep_shown``)
        self._record_input = input  # what it answered, for the history (else asked of its server)
        self._origin = origin_of(source) if record else None
        kind = self._kind = classify(source)
        live = kind in ("async", "async_manager", "sync")
        self._interrupt, self._closer = cancel_hooks(source, cancel) if live else (None, None)
        cancellable = live and (self._interrupt is not None or self._closer is not None)
        self._folder = Folder(empty_state(cancellable), PatchBuffer())
        self._seq = 0
        self._flush_interval = flush_interval
        self._flush_handle: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[None] | None = None
        self._exception: BaseException | None = None
        self._cancelling = False
        self._cancel_final: dict[str, Any] | None = None  # what the cancel hook returned
        self._print_at_end = False  # shown outside IPython: print the text when done
        self._final: Response | None = None
        self._display_ids: list[str] = []
        self._shown_in: int | None = None
        self._snapshot = {"seq": 0, "state": plain(self.state)}
        self.on_msg(self._on_front_end)

        if kind == "response":
            if shape_of(source):
                source = as_response(source, choice)
            elif is_error_body(source):
                source = error_response(source)
            self._folder.load_response(source)
            self._finish(measured=False)
        elif kind == "events":
            for event in as_events(source, choice):
                self._folder.apply(event)
            self._finish(interrupted=self._folder.terminal is None, measured=False)
        else:
            events = as_async(source, kind, self._closer if kind == "sync" else None)
            self._start(read_chunks(events, choice))

    # ------------------------------------------------------------------ public API

    @property
    def state(self) -> dict[str, Any]:
        """The authoritative state: ``{"response": <Response as dict>, "view": <timings...>}``."""
        return self._folder.state

    @property
    def done(self) -> bool:
        """Whether the source has ended (completed, failed, interrupted or cancelled)."""
        return self.state["view"]["phase"] == "done"

    @property
    def status(self) -> str:
        """The status as the view shows it, e.g. ``completed`` or ``incomplete (max_tokens)``."""
        return status_label(self.state)

    @property
    def response(self) -> Response:
        """The Response folded so far (the final one once ``done``)."""
        if self._final is not None:
            return self._final
        response = to_response(self.state["response"])
        if self.done:
            self._final = response  # built once, on demand: large logprob lists are not free
        return response

    async def wait(self) -> Response:
        """Wait for the end of the stream; re-raises an exception raised by the source."""
        if self._task is not None:
            try:
                await asyncio.shield(self._task)
            except asyncio.CancelledError:
                if not (self._cancelling and self._task.cancelled()):
                    raise  # we are being cancelled ourselves, not the stream
        # Re-publish from the awaiting cell too: the update sent when the stream ended carries
        # the parent of the cell that started it, which front ends may no longer route.
        self._refresh_displays()
        if self._exception is not None:
            raise self._exception
        return self.response

    def __await__(self) -> Any:
        return self.wait().__await__()

    async def cancel(self) -> None:
        """Stop the stream: call the cancel hook, stop reading, show the view as cancelled."""
        if self.done or self._cancelling:
            return
        self._cancelling = True
        if self._interrupt is not None:
            try:
                final = plain(await call_hook(self._interrupt))
                self._cancel_final = final if isinstance(final, dict) else None
            except Exception as exc:
                self._folder.record_error(f"cancel hook failed: {exc}")
        if self._task is not None and not self._task.done():
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.shield(self._task)
        if not self.done:  # cancelled before the task ever ran
            self._mark_cancelled()
            await self._close_source()
            self._finish()
        elif self._cancel_final is not None:  # the stream ended before the hook returned
            self._mark_cancelled()
            self._republish()

    def display(self) -> ResponseView:
        """Show the view in the notebook (HTML fallback included); returns the view.

        Outside IPython (a script, a terminal) there is nothing to render a widget: the text
        summary is printed instead, once the stream has ended."""
        from IPython.display import display

        if not _in_ipython():
            self._print_at_end = True
            if self.done:
                self._print_summary()
            return self
        data, metadata = self._repr_mimebundle_()
        display_id = uuid.uuid4().hex
        self._display_ids.append(display_id)
        display(data, raw=True, metadata=metadata, display_id=display_id)
        return self

    # ------------------------------------------------------------------ representations

    def _repr_mimebundle_(self, **kwargs: Any) -> tuple[dict[str, Any], dict[str, Any]]:
        bundle = super()._repr_mimebundle_(**kwargs)
        data, metadata = bundle if isinstance(bundle, tuple) else (bundle or {}, {})
        data = {**data, "text/html": render_html(self.state)}
        return data, metadata

    def _ipython_display_(self, **kwargs: Any) -> None:
        # show() already displayed the view in this cell; its return value must not add a copy.
        if self._shown_in is not None and self._shown_in == _execution_count():
            self._shown_in = None
            return
        self.display()

    def __repr__(self) -> str:
        response = self.state["response"]
        items = sum(1 for item in response["output"] if item is not None)
        return f"<ResponseView {response.get('id') or '?'} {self.status}, {items} item(s)>"

    # ------------------------------------------------------------------ streaming

    def _start(self, events: AsyncIterator[Any]) -> None:
        try:
            self._loop = asyncio.get_running_loop()
        except RuntimeError:
            asyncio.run(self._consume(events))  # no kernel loop (a script): read it all now
            return
        self._task = self._loop.create_task(self._consume(events), name="nbresponses-view")

    async def _consume(self, events: AsyncIterator[Any]) -> None:
        self._loop = asyncio.get_running_loop()
        apply = self._folder.apply
        interrupted = True
        try:
            async for event in events:
                apply(event)
                if self._flush_handle is None:
                    self._flush_handle = self._loop.call_later(self._flush_interval, self._flush)
            interrupted = self._folder.terminal is None
            if interrupted and self._cancelling:  # it ended because we cancelled it
                self._mark_cancelled()
                interrupted = False
        except asyncio.CancelledError:
            if not self._cancelling:
                self._finish(interrupted=True)
                raise
            self._mark_cancelled()
            await self._close_source()
            interrupted = False
        except Exception as exc:
            self._exception = exc
            self._folder.record_exception(exc)
        self._finish(interrupted=interrupted)

    async def _close_source(self) -> None:
        """Release a cancelled source (a sync source's thread closes it itself)."""
        if self._closer is not None and self._kind != "sync":
            with contextlib.suppress(Exception):
                await call_hook(self._closer)

    def _mark_cancelled(self) -> None:
        self._folder.mark_cancelled(self._cancel_final)

    def _flush(self) -> None:
        """Send what changed since the last flush as one patch message."""
        self._flush_handle = None
        self._folder.flush_derived()
        self._send_patches()

    def _send_patches(self) -> None:
        ops = self._folder.patches.take()
        if ops:
            self._seq += 1
            self._post({"kind": "patch", "seq": self._seq, "ops": ops})

    def _finish(self, *, interrupted: bool = False, measured: bool = True) -> None:
        if self._flush_handle is not None:
            self._flush_handle.cancel()
            self._flush_handle = None
        self._folder.finish(interrupted=interrupted, measured=measured)
        self._publish_end()
        if self._record:
            self._record = False
            keep_shown(self.response, self._origin, self._record_input)
        if self._print_at_end:
            self._print_summary()

    def _publish_end(self) -> None:
        """Patches (they alone stay complete), then the snapshot at the same seq for late front
        ends and the displays' HTML fallback."""
        self._send_patches()
        # no copy: the state no longer changes once the stream is done
        self._snapshot = {"seq": self._seq, "state": self.state}
        self._refresh_displays()

    def _print_summary(self) -> None:
        self._print_at_end = False
        print(self.text())

    def text(self) -> str:
        """The view as plain text: status, model, the output's text, usage and timings."""
        response = self.state["response"]
        head = " · ".join(str(x) for x in (self.status, response.get("model")) if x)
        body = self.response.output_text
        usage = usage_line(self.state)
        return "\n".join(part for part in (head, body, usage) if part)

    def _republish(self) -> None:
        """Send a change made after the end (the cancel hook's final usage) everywhere."""
        self._final = None
        self._publish_end()

    def _refresh_displays(self) -> None:
        """Re-publish displays so saved notebooks keep the final HTML fallback."""
        if not self._display_ids:
            return
        from IPython.display import update_display

        data, metadata = self._repr_mimebundle_()
        for display_id in self._display_ids:
            update_display(data, raw=True, metadata=metadata, display_id=display_id)

    # ------------------------------------------------------------------ front-end messages

    def _post(self, content: dict[str, Any]) -> None:
        self.send(content)

    def _on_front_end(self, _widget: Any, content: Any, _buffers: Any) -> None:
        if not isinstance(content, dict):
            return
        kind = content.get("kind")
        if kind == "sync":
            if not self.done:
                self._flush()
            self._post({"kind": "snapshot", "seq": self._seq, "state": self.state})
        elif kind == "cancel" and self._loop is not None:
            self._loop.create_task(self.cancel())


def _in_ipython() -> bool:
    from IPython import get_ipython

    return get_ipython() is not None


def _execution_count() -> int | None:
    try:
        from IPython import get_ipython
    except ImportError:
        return None
    shell = get_ipython()
    return getattr(shell, "execution_count", None) if shell is not None else None


def show(
    source: Any,
    *,
    cancel: Hook | None = None,
    record: bool = False,
    choice: int = 0,
    input: Any = None,
) -> ResponseView:
    """Display a live view of a Responses stream or Response and return it.

    ``source``: an async or sync iterator of ``ResponseStreamEvent`` (ours or the openai SDK's
    ``AsyncStream``/``Stream``), a finished ``Response`` or a list of events (models or dicts).
    Chat Completions and legacy Completions are shown the same way, from any server: a stream
    of ``ChatCompletionChunk`` (text, tool-call deltas, ``reasoning_content``/``reasoning``,
    the logprob heat map, the usage of the final chunk), a ``ChatCompletion``, a
    ``Completion`` or its stream; ``choice`` picks one of ``n > 1`` choices.
    ``cancel``: called (and awaited if it is a coroutine function) by the view's cancel button.
    ``record``: keep the finished response in the history (``nbr.record``) with the host it
    was streamed from: for remote streams (this engine's own are kept already). ``input``:
    the request's input, kept with it (without it, it is asked of the server that kept it).
    """
    view = ResponseView(source, cancel=cancel, record=record, choice=choice, input=input)
    view.display()
    view._shown_in = _execution_count()
    return view
