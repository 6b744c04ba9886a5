"""The real engine in process, graceful shutdown, and the ``serve`` command line."""

from __future__ import annotations

import asyncio
import json
import socket

import httpx2
import pytest
from helpers.responses import MODEL
from helpers.server import ThreadedServer, scripted

from nbresponses.cli import COMMANDS, build_parser
from nbresponses.server.app import create_app
from nbresponses.server.serve import is_loopback
from nbresponses.server.transport import ASGIStreamTransport

pytestmark = pytest.mark.timeout(120)
LONG = " ".join(["word"] * 400)


async def test_real_onnx_engine_through_the_in_process_sdk(tiny_model, tokenizer):
    from nbresponses.engine import Engine
    from nbresponses.runtime.generator import TokenGenerator

    engine = Engine(TokenGenerator(tiny_model, tokenizer=tokenizer))
    try:
        sdk = engine.openai()
        kwargs = {"model": engine.model, "input": "Hello!", "max_output_tokens": 6}
        plain = await sdk.responses.create(
            **kwargs, temperature=0, include=["message.output_text.logprobs"], top_logprobs=2
        )
        assert plain.model == engine.model and plain.usage.output_tokens >= 1
        assert plain.status in ("completed", "incomplete")
        # (a random tiny model runs out of tokens: the stream ends with response.incomplete,
        # which the SDK's stream() helper refuses to fold, as it would against OpenAI)
        events = [e async for e in await sdk.responses.create(**kwargs, temperature=0, stream=True)]
        assert events[-1].type == f"response.{plain.status}"
        text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
        assert text == events[-1].response.output_text == plain.output_text  # greedy: the same
        sync = await asyncio.to_thread(engine.openai(sync=True).responses.create, **kwargs)
        assert sync.usage.output_tokens == plain.usage.output_tokens
        assert (await engine.client().responses.retrieve(sync.id)).id == sync.id  # one store
    finally:
        await engine.aclose()


async def test_drain_cancels_streams_in_flight_and_refuses_new_work(tokenizer):
    client, source = scripted(tokenizer, LONG, delay=0.01)
    app = create_app(client)
    http = httpx2.AsyncClient(transport=ASGIStreamTransport(app), base_url="http://x")
    async with http:
        request = http.build_request("POST", "/v1/responses", json={"input": "x", "stream": True})
        response = await http.send(request, stream=True)
        lines = response.aiter_lines()
        while "output_text.delta" not in await anext(lines):
            pass
        drain = asyncio.create_task(app.state.api.drain(grace=0.05))
        rest = [line async for line in lines]
        await drain
        events = [line for line in rest if line.startswith("event: ")]
        # the open items are closed; OpenAI streams have no terminal event for a cancel
        assert events[-1] == "event: response.output_item.done"
        assert "event: error" not in events and source.cancelled == 1
        item = json.loads(rest[rest.index(events[-1]) + 1][len("data: ") :])["item"]
        assert item["status"] == "incomplete" and item["content"][0]["text"].startswith("word")
        refused = await http.post("/v1/responses", json={"input": "x"})
        assert refused.status_code == 503 and refused.json()["error"]["type"] == "server_error"


def test_stopping_uvicorn_ends_streams_cleanly(tokenizer):
    client, source = scripted(tokenizer, LONG, delay=0.01)
    server = ThreadedServer(client, grace=0.1).__enter__()
    try:
        stream = server.openai(sync=True).responses.create(model=MODEL, input="x", stream=True)
        for event in stream:
            if event.type == "response.created":
                rid = event.response.id
            if event.type == "response.output_text.delta":
                server.server.should_exit = True  # what Ctrl-C / SIGTERM does
                break
        rest = [e for e in stream]  # the rest arrives, then a clean end of stream
        assert rest[-1].type == "response.output_item.done"
        assert rest[-1].item.status == "incomplete" and source.cancelled == 1
        assert client.store.get(rid).run.response.status == "cancelled"
    finally:
        server.stop()


def test_a_server_given_a_socket_sends_its_answers_without_delay(tokenizer):
    """uvicorn writes an answer's head and body apart; on a socket made with
    ``socket.socket()`` (proto 0, so asyncio leaves Nagle's algorithm on) the body waited for
    the client's delayed ACK, 40 ms a request. The server sets TCP_NODELAY on the sockets it
    is given, and the connections they accept have it."""
    client, _ = scripted(tokenizer, "Hi")
    with ThreadedServer(client) as server, server.http() as http:
        assert server.sock.proto == 0  # the case asyncio does not cover
        assert http.get("/v1/models").status_code == 200  # the connection stays open
        connections = list(server.server.server_state.connections)
        accepted = [c.transport.get_extra_info("socket") for c in connections]
        assert accepted, "the request's connection is open"
        for sock in accepted:
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0


def test_serve_command_line(monkeypatch):
    args = build_parser().parse_args(
        ["serve", "tiny", "-q", "fp32", "--port", "9001", "--api-key", "k"]
    )
    assert (args.model, args.quantization, args.host, args.port, args.api_key) == (
        "tiny",
        "fp32",
        "127.0.0.1",
        9001,
        "k",
    )
    seen = {}
    import nbresponses.cli as cli_module

    monkeypatch.setattr(cli_module, "serve", lambda *a, **kw: seen.update(args=a, **kw))
    assert COMMANDS["serve"](args) == 0
    assert seen["args"] == ("tiny", "fp32") and seen["port"] == 9001 and seen["api_key"] == "k"
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("example.org")
