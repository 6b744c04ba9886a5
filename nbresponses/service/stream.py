"""The object a streaming ``create`` / ``retrieve`` returns, shaped like the SDK's ``AsyncStream``.

Async-iterable, an async context manager, ``close()``; plus ``cancel()`` (stop generating and
keep the partial output) and ``response`` (the live snapshot). Closing the stream a
non-background ``create`` returned stops its generation, as dropping an HTTP stream does;
closing a background or ``retrieve`` stream only stops reading.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Sequence
from types import TracebackType
from typing import Generic, TypeVar

from openai.types.responses import Response, ResponseStreamEvent

from nbresponses.service.run import ResponseRun

T = TypeVar("T")
C = TypeVar("C")
P = TypeVar("P")
S = TypeVar("S", bound="AsyncStream[object]")


class AsyncStream(Generic[T]):
    """What every stream we return shares with the SDK's ``AsyncStream``: iterate it, ``async
    with`` it (closed on exit). A subclass sets ``_iterator`` and says what ``close`` stops."""

    _iterator: AsyncIterator[T]

    def __aiter__(self) -> AsyncIterator[T]:
        return self

    async def __anext__(self) -> T:
        return await self._iterator.__anext__()

    async def __aenter__(self: S) -> S:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def close(self) -> None:
        raise NotImplementedError


class Interleaved(Generic[C, P]):
    """The pieces of several choices (``n``, or one per prompt), each read by its own task, in
    the order they arrive: a slow choice never holds back a fast one's chunks. A choice's
    failure ends the whole stream with its exception, as one HTTP stream would."""

    def __init__(self, choices: Sequence[C], pieces: Callable[[C], AsyncIterator[P]]) -> None:
        self._choices = choices
        self._pieces = pieces
        self._queue: asyncio.Queue[tuple[C, P] | BaseException | None] = asyncio.Queue()
        self.tasks: list[asyncio.Task[None]] = []

    async def _pump(self, choice: C) -> None:
        try:
            async for piece in self._pieces(choice):
                self._queue.put_nowait((choice, piece))
        except asyncio.CancelledError:
            raise
        except BaseException as exc:
            self._queue.put_nowait(exc)
        finally:
            self._queue.put_nowait(None)

    async def __aiter__(self) -> AsyncIterator[tuple[C, P]]:
        self.tasks = [asyncio.ensure_future(self._pump(c)) for c in self._choices]
        running = len(self.tasks)
        while running:
            item = await self._queue.get()
            if item is None:
                running -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield item

    async def stop(self) -> None:
        """Cancel the readers and wait for them to end."""
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)


class ResponseEventStream(AsyncStream[ResponseStreamEvent]):
    """Iterate it for ``ResponseStreamEvent``s; ``async with`` closes it on exit."""

    def __init__(self, run: ResponseRun, *, after: int = -1, owns_run: bool = False) -> None:
        self._run = run
        self._iterator = run.follow(after)
        self._owns_run = owns_run
        self._closed = False

    @property
    def response_id(self) -> str:
        return self._run.id

    @property
    def response(self) -> Response:
        """The response as it stands now (a copy)."""
        return self._run.response.model_copy(deep=True)

    async def __anext__(self) -> ResponseStreamEvent:
        if self._closed:
            raise StopAsyncIteration
        return await self._iterator.__anext__()

    async def close(self) -> None:
        """Stop reading; a non-background create's own stream also stops the generation."""
        if self._closed:
            return
        self._closed = True
        await self._iterator.aclose()  # type: ignore[attr-defined]
        if self._owns_run and not self._run.done.is_set():
            self._run.cancel()
            await self._run.wait()

    async def cancel(self) -> Response:
        """Stop the generation now; the events up to here and the partial output remain."""
        self._run.cancel()
        return (await self._run.wait()).model_copy(deep=True)

    async def until_done(self) -> Response:
        """Read to the end; the final response."""
        async for _ in self:
            pass
        return self.response
