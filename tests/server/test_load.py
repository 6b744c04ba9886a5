"""Load over real HTTP on loopback: 50 concurrent streams, and no memory growth over 500 calls."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import httpx2
import openai
import pytest
from helpers.responses import MODEL
from helpers.server import ThreadedServer, scripted

pytestmark = [pytest.mark.timeout(180), pytest.mark.slow]
TEXT = "The quick brown fox jumps over the lazy dog, again and again."


async def test_fifty_concurrent_streaming_clients(tokenizer):
    client, source = scripted(tokenizer, TEXT, delay=0.002)
    with ThreadedServer(client) as server:
        limits = httpx2.Limits(max_connections=64)
        sdks = [
            server.openai(http_client=httpx2.AsyncClient(limits=limits, timeout=60))
            for _ in range(5)
        ]

        async def one(i: int) -> tuple[str, list[int], str]:
            stream = await sdks[i % 5].responses.create(model=MODEL, input=f"#{i}", stream=True)
            text, numbers = [], []
            async for event in stream:
                numbers.append(event.sequence_number)
                if event.type == "response.output_text.delta":
                    text.append(event.delta)
            return "".join(text), numbers, event.response.output_text

        results = await asyncio.gather(*(one(i) for i in range(50)))
    assert len(source.prompts) == 50
    for text, numbers, final in results:
        assert text == final == TEXT
        assert numbers == list(range(len(numbers)))


SERVER = textwrap.dedent(
    """
    import asyncio, collections, gc, sys, threading, time
    from transformers import AutoTokenizer
    from nbresponses.tokens.scripted import Script, ScriptedTokenSource
    from nbresponses.service.client import AsyncResponsesClient
    from nbresponses.server.serve import make_server

    tok = AutoTokenizer.from_pretrained(sys.argv[1])
    source = ScriptedTokenSource([tok.encode("The capital of France is Paris.") + [2]])
    # the scripted source records every prompt for tests: bound that, to measure the server
    source.prompts, source.params = collections.deque(maxlen=8), collections.deque(maxlen=8)
    client = AsyncResponsesClient(source, tok, model="smollm2", store_max_responses=50)
    server = make_server(client, host="127.0.0.1", port=int(sys.argv[2]), log_level="warning")

    def collect():  # measure what is retained, not when the cyclic collector happens to run
        while True:
            time.sleep(0.25)
            gc.collect()

    threading.Thread(target=collect, daemon=True).start()
    asyncio.run(server.serve())
    """
)


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError("no VmRSS")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs /proc")
def test_rss_is_flat_over_500_sequential_requests(tokenizer_dir):
    port = free_port()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    proc = subprocess.Popen([sys.executable, "-c", SERVER, str(tokenizer_dir), str(port)], env=env)
    try:
        sdk = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x", max_retries=0)
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx2.get(f"http://127.0.0.1:{port}/health").status_code == 200:
                    break
            except httpx2.TransportError:
                pass
            assert proc.poll() is None and time.monotonic() < deadline, "server did not start"
            time.sleep(0.1)

        def call(i: int) -> None:
            if i % 2:
                r = sdk.responses.create(model=MODEL, input=f"q{i}")
                assert r.output_text == "The capital of France is Paris."
            else:
                events = list(sdk.responses.create(model=MODEL, input=f"q{i}", stream=True))
                assert events[-1].type == "response.completed"

        for i in range(150):  # warm-up: caches, the store filled to its bound, allocator pools
            call(i)
        time.sleep(0.5)  # one pass of the collector thread
        before = rss_kib(proc.pid)
        for i in range(500):
            call(i)
        time.sleep(0.5)
        after = rss_kib(proc.pid)
        growth = after - before
        print(f"server RSS {before} KiB -> {after} KiB over 500 requests ({growth:+d} KiB)")
        assert growth < 2048, f"RSS grew by {growth} KiB"
    finally:
        proc.terminate()
        proc.wait(30)
