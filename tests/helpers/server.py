"""Helpers for the server tests: scripted clients, a gated source, a uvicorn server in a thread."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import Sequence
from typing import Any

import httpx2
import openai

from helpers.responses import client_for, ids
from nbresponses.server.inprocess import InProcessServer
from nbresponses.server.serve import make_server
from nbresponses.service.client import AsyncResponsesClient
from nbresponses.tokens.contract import SamplingParams, Step, TokenStream
from nbresponses.tokens.scripted import Script, ScriptedTokenSource


def tool_call(name: str, arguments: dict[str, Any]) -> str:
    """A Hermes tool call, as SmolLM2's chat template asks the model to write it."""
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


def scripted(
    tokenizer: Any, *scripts: str | Script, delay: float = 0.0
) -> tuple[AsyncResponsesClient, ScriptedTokenSource]:
    """``client_for`` with ``delay`` seconds before each token of the text scripts."""
    return client_for(
        tokenizer,
        *(s if isinstance(s, Script) else Script(ids(tokenizer, s), delay=delay) for s in scripts),
    )


class GatedSource(ScriptedTokenSource):
    """A scripted source that yields token i only once ``permit`` has been called i+1 times.

    The gate makes streaming observable without timing: if a transport buffered the body,
    a reader that permits one token per event it has seen would wait forever.
    """

    def __init__(self, scripts: Sequence[Script | Sequence[int]], **kw: Any) -> None:
        super().__init__(scripts, **kw)
        self.allowed = 0
        self.produced = 0
        self._lock = threading.Lock()

    def permit(self, n: int = 1) -> None:
        with self._lock:
            self.allowed += n

    def generate(self, prompt_ids: Sequence[int], params: SamplingParams) -> _GatedStream:
        return _GatedStream(self, super().generate(prompt_ids, params))


class _GatedStream:
    """A scripted stream whose token steps wait for their source's permits."""

    def __init__(self, source: GatedSource, inner: TokenStream) -> None:
        self._source = source
        self._inner = inner

    def __aiter__(self) -> _GatedStream:
        return self

    async def __anext__(self) -> Step:
        step = await anext(self._inner)
        if step.token_ids:
            while self._source.allowed <= self._source.produced:
                await asyncio.sleep(0.001)
            self._source.produced += 1
        return step

    def cancel(self) -> None:
        self._inner.cancel()

    async def aclose(self) -> None:
        await self._inner.aclose()


class ThreadedServer:
    """``make_server(client)`` on uvicorn in a thread, on a free loopback port."""

    def __init__(self, client: AsyncResponsesClient, **options: Any) -> None:
        options.setdefault("log_level", "warning")
        options.setdefault("grace", 2.0)
        self.server = make_server(client, host="127.0.0.1", port=0, **options)
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.base_url = f"http://127.0.0.1:{self.port}/v1"
        self.loop: asyncio.AbstractEventLoop | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.loop.run_until_complete(self.server.serve(sockets=[self.sock]))
        self.loop.close()

    def __enter__(self) -> ThreadedServer:
        self._thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("uvicorn did not start")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self._thread.join(30)
        self.sock.close()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def openai(self, *, sync: bool = False, **options: Any) -> Any:
        options.setdefault("api_key", "unused")
        options.setdefault("max_retries", 0)
        if sync:
            return openai.OpenAI(base_url=self.base_url, **options)
        return openai.AsyncOpenAI(base_url=self.base_url, **options)

    def http(self) -> httpx2.Client:
        return httpx2.Client(base_url=f"http://127.0.0.1:{self.port}", timeout=30)


class Target:
    """One way to reach a client with the openai SDK: in process, or over HTTP."""

    def __init__(self, kind: str, client: AsyncResponsesClient) -> None:
        self.kind = kind
        self.client = client
        self.server = ThreadedServer(client) if kind == "http" else None
        self.inprocess = InProcessServer(client)

    def __enter__(self) -> Target:
        if self.server is not None:
            self.server.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.server is not None:
            self.server.stop()
        self.inprocess.close()

    def openai(self, *, sync: bool = False, **options: Any) -> Any:
        if self.server is not None:
            return self.server.openai(sync=sync, **options)
        return self.inprocess.openai(sync=sync, **options)


async def eventually(check: Any, timeout: float = 10.0) -> None:
    """Wait (bounded) until ``check()`` is true: for effects on another thread or process."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.01)
