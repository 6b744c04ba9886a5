"""The object a streaming ``create`` / ``retrieve`` returns, shaped like the SDK's ``AsyncStream``.

Async-iterable, an async context manager, ``close()``; plus ``cancel()`` (stop generating and
keep the partial output) and ``response`` (the live snapshot). Closing the stream a
non-background ``create`` returned stops its generation, as dropping an HTTP stream does;
closing a background or ``retrieve`` stream only stops reading.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from types import TracebackType

from openai.types.responses import Response, ResponseStreamEvent

from nbresponses.service.run import ResponseRun


class ResponseEventStream:
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

    def __aiter__(self) -> AsyncIterator[ResponseStreamEvent]:
        return self

    async def __anext__(self) -> ResponseStreamEvent:
        if self._closed:
            raise StopAsyncIteration
        return await self._iterator.__anext__()

    async def __aenter__(self) -> ResponseEventStream:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

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
