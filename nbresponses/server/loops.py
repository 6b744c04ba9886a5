"""Event loops: a loop on a thread for the sync client, and calls onto the loop a run lives on.

A ``ResponseRun`` belongs to the event loop that started it (its task and ``asyncio.Event``s).
The async in-process client serves requests on the caller's loop (the notebook's); the sync
client cannot — its call blocks that very loop's thread — so it serves on a ``LoopThread``.
A request that touches a run owned by the other loop (follow, cancel, delete, snapshot) is
carried over to the owner with ``on_loop``. The one thing that cannot work is a sync call
from the notebook's thread waiting on a run the notebook's loop is generating: that loop is
blocked by the call itself, so the request names the loop it blocks (``BLOCKED``) and gets a
clean 400 instead of a deadlock.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from typing import Any, TypeVar

from nbresponses.server.errors import HTTPError

T = TypeVar("T")

# ASGI scope extension: the event loop whose thread is blocked waiting for this request.
BLOCKED = "nbresponses.blocked_loop"


class LoopThread:
    """An event loop running forever on a daemon thread."""

    def __init__(self, name: str = "nbresponses-server") -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def close(self, timeout: float = 5.0) -> None:
        """Cancel what still runs there, stop the loop and join the thread."""
        if self.loop.is_closed():
            return

        async def cancel_all() -> None:
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        if self._thread.is_alive():
            try:
                self.submit(cancel_all()).result(timeout)
            finally:
                self.loop.call_soon_threadsafe(self.loop.stop)
                self._thread.join(timeout)
        if not self._thread.is_alive():
            self.loop.close()


def foreign(
    response_id: str,
    loop: asyncio.AbstractEventLoop | None,
    blocked: asyncio.AbstractEventLoop | None,
    *,
    read_only: bool = False,
) -> asyncio.AbstractEventLoop | None:
    """The loop a call about a response must be carried to; None when it is safe to call here.

    ``loop`` is the one generating the response (None once it finished: a finished response
    is only read, which is safe from any thread). So is a response whose loop is not running
    (closed, stopped, or blocked by this very call), since nothing touches it meanwhile.
    """
    if loop is None or loop.is_closed() or not loop.is_running():
        return None
    try:
        here = asyncio.get_running_loop()
    except RuntimeError:
        here = None
    if loop is here:
        return None
    if loop is blocked:
        if read_only:
            return None
        raise HTTPError(
            400,
            f"Response '{response_id}' is being generated on the event loop this synchronous "
            "call blocks. Follow it with the async client (engine.openai()) instead.",
            param="response_id",
            code="blocked_event_loop",
        )
    return loop


async def on_loop(loop: asyncio.AbstractEventLoop | None, fn: Callable[[], Awaitable[T]]) -> T:
    """Await ``fn()`` on ``loop`` (or here when ``loop`` is None)."""
    if loop is None:
        return await fn()

    async def call() -> T:
        return await fn()

    return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(call(), loop))


async def iterate_on(
    loop: asyncio.AbstractEventLoop, iterator: AsyncIterator[T]
) -> AsyncIterator[T]:
    """Iterate ``iterator`` (which belongs to ``loop``) from this loop, one item at a time."""
    done = object()

    async def step() -> Any:
        try:
            return await iterator.__anext__()
        except StopAsyncIteration:
            return done

    while True:
        item = await on_loop(loop, step)
        if item is done:
            return
        yield item
