"""Recognise what ``show()`` was given and turn live sources into one async event stream.

A sync iterator (the openai SDK's ``Stream``, a generator) is read in a worker thread so that a
blocking ``next()`` never stalls the kernel's event loop; its events are handed to the loop in
batches, with one wake-up per batch rather than one per event.
"""

from __future__ import annotations

import asyncio
import inspect
import threading
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterable
from typing import Any, Literal

from pydantic import BaseModel

from nbresponses.traffic.chat import CHAT, TEXT, EventReader, is_error_body, shape_of

SourceKind = Literal["response", "events", "async", "async_manager", "sync"]
Hook = Callable[[], Any]


def classify(source: Any) -> SourceKind:
    """Which of the accepted source shapes ``source`` is."""
    if isinstance(source, BaseModel) and getattr(source, "object", None) == "response":
        return "response"
    if shape_of(source) in (CHAT, TEXT) or is_error_body(source):
        return "response"  # a ChatCompletion, a Completion or an error body (``traffic.chat``)
    if isinstance(source, dict):
        if source.get("object") == "response" or ("output" in source and "type" not in source):
            return "response"
        raise TypeError(
            "a dict source must be a Response (with 'object': 'response'), a ChatCompletion, "
            "a Completion or an error body"
        )
    if isinstance(source, (list, tuple)):
        return "events"
    if hasattr(source, "__aiter__"):
        return "async"
    if hasattr(source, "__aenter__"):
        return "async_manager"  # e.g. client.responses.stream(...) before `async with`
    if isinstance(source, Iterable) and not isinstance(source, (str, bytes)):
        return "sync"
    raise TypeError(
        "show() takes a Response, ChatCompletion or Completion, a list of events or chunks, "
        "or a sync/async iterator of ResponseStreamEvent or ChatCompletionChunk; "
        f"got {type(source).__name__}"
    )


def cancel_hooks(source: Any, cancel: Hook | None) -> tuple[Hook | None, Hook | None]:
    """``(interrupt, closer)``: what to call on cancel before and after we stop iterating.

    ``interrupt`` tells the producer to stop (the user's ``cancel=`` or the source's own
    ``cancel()``) and may run while iteration is suspended; ``closer`` (``aclose()``/``close()``)
    releases the source and is only safe once our iteration has stopped.
    """
    interrupt = cancel
    if interrupt is None:
        method = getattr(source, "cancel", None)
        interrupt = method if callable(method) else None
    closer = None
    for name in ("aclose", "close"):
        method = getattr(source, name, None)
        if callable(method):
            closer = method
            break
    return interrupt, closer


async def call_hook(hook: Hook) -> Any:
    """Call a sync or async hook and wait for it; what it returned (a stream's ``cancel()``
    may return the final Response)."""
    result = hook()
    if inspect.isawaitable(result):
        result = await result
    return result


async def events_from_thread(
    iterable: Iterable[Any], closer: Hook | None = None
) -> AsyncIterator[Any]:
    """Iterate a blocking iterable in a daemon thread, yielding its items on the event loop."""
    loop = asyncio.get_running_loop()
    pending: deque[Any] = deque()
    lock = threading.Lock()
    wake = asyncio.Event()
    stop = threading.Event()
    flags = {"scheduled": False, "done": False}
    failure: list[BaseException] = []

    def notify() -> None:
        with lock:
            if flags["scheduled"]:
                return
            flags["scheduled"] = True
        try:
            loop.call_soon_threadsafe(wake.set)
        except RuntimeError:  # the loop closed under us; nobody is listening any more
            stop.set()

    def worker() -> None:
        try:
            for item in iterable:
                if stop.is_set():
                    break
                pending.append(item)
                notify()
        except BaseException as exc:
            failure.append(exc)
        finally:
            if stop.is_set() and closer is not None:
                try:
                    result = closer()
                    if inspect.iscoroutine(result):
                        result.close()  # an async closer cannot run here; drop it cleanly
                except Exception:
                    pass
            with lock:
                flags["done"] = True
                flags["scheduled"] = False  # force one more wake-up so the end is seen
            notify()

    thread = threading.Thread(target=worker, name="nbresponses-view-source", daemon=True)
    thread.start()
    try:
        while True:
            await wake.wait()
            with lock:
                wake.clear()
                flags["scheduled"] = False
                done = flags["done"]
            while pending:
                yield pending.popleft()
            if done:
                while pending:
                    yield pending.popleft()
                break
        if failure:
            raise failure[0]
    finally:
        stop.set()


async def events_from_manager(manager: Any) -> AsyncIterator[Any]:
    """Enter an async stream manager (``client.responses.stream(...)``) and iterate it."""
    async with manager as stream:
        async for event in stream:
            yield event


async def read_chunks(events: AsyncIterator[Any], choice: int = 0) -> AsyncIterator[Any]:
    """The source's items as Responses events: Chat Completions and Completions chunks are
    read into them (``traffic.chat``), Responses events pass. The last stream's terminal
    events come only when the source ends by itself (not when it raises or is cancelled)."""
    reader = EventReader(choice)
    async for item in events:
        for event in reader.feed(item):
            yield event
    for event in reader.end():
        yield event


def as_async(source: Any, kind: SourceKind, closer: Hook | None) -> AsyncIterator[Any]:
    """One async iterator over a live source of any accepted kind."""
    if kind == "async":
        return source.__aiter__()
    if kind == "async_manager":
        return events_from_manager(source)
    if kind == "sync":
        return events_from_thread(source, closer)
    raise TypeError(f"not a live source: {kind}")
