"""Live behaviour of the view: background streaming, threads, cancel, bad input, display."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx2 as httpx  # the HTTP client this openai SDK is built on
import openai
import pytest

from nbresponses.view import ResponseView, show
from nbresponses.view.patches import PatchBuffer, apply_ops


def text_stream(text: str, *, rid: str = "resp_1", complete: bool = True) -> list[dict[str, Any]]:
    """A minimal, well-formed stream that writes ``text`` one character per delta."""
    item = {"type": "message", "id": "msg_1", "role": "assistant", "status": "in_progress"}
    events: list[dict[str, Any]] = [
        {
            "type": "response.created",
            "response": {"id": rid, "status": "in_progress", "output": []},
        },
        {"type": "response.output_item.added", "output_index": 0, "item": {**item, "content": []}},
        {
            "type": "response.content_part.added",
            "output_index": 0,
            "content_index": 0,
            "part": {"type": "output_text", "text": "", "annotations": []},
        },
    ]
    events += [
        {"type": "response.output_text.delta", "output_index": 0, "content_index": 0, "delta": c}
        for c in text
    ]
    if complete:
        done = {
            **item,
            "status": "completed",
            "content": [{"type": "output_text", "text": text, "annotations": []}],
        }
        usage = {
            "input_tokens": 3,
            "input_tokens_details": {"cached_tokens": 1},
            "output_tokens": len(text),
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": 3 + len(text),
        }
        events += [
            {"type": "response.output_item.done", "output_index": 0, "item": done},
            {
                "type": "response.completed",
                "response": {"id": rid, "status": "completed", "output": [done], "usage": usage},
            },
        ]
    return events


async def paced(events: list[Any], delay: float = 0.0) -> AsyncIterator[Any]:
    for event in events:
        yield event
        await asyncio.sleep(delay)


def capture(view: ResponseView) -> list[dict[str, Any]]:
    sent: list[dict[str, Any]] = []
    view._post = sent.append  # type: ignore[method-assign]
    return sent


async def test_show_returns_at_once_and_await_gives_the_response() -> None:
    view = ResponseView(paced(text_stream("hello world"), 0.001))
    assert not view.done  # the constructor returned before the stream was read
    response = await view
    assert view.done and response.output_text == "hello world"
    assert response.status == "completed" and response.usage.input_tokens == 3
    assert view.status == "completed"


async def test_several_views_stream_at_once() -> None:
    started = time.perf_counter()
    views = [ResponseView(paced(text_stream(f"view {i} " * 10), 0.002)) for i in range(4)]
    responses = await asyncio.gather(*(v.wait() for v in views))
    elapsed = time.perf_counter() - started
    one = len(text_stream("view 0 " * 10)) * 0.002
    assert [r.output_text for r in responses] == [f"view {i} " * 10 for i in range(4)]
    assert elapsed < 3 * one  # concurrent, not one after another


async def test_sync_iterator_is_read_in_a_thread_without_blocking_the_loop() -> None:
    threads: set[str] = set()

    def slow() -> Iterator[dict[str, Any]]:
        for event in text_stream("abcdefgh"):
            threads.add(threading.current_thread().name)
            time.sleep(0.01)  # a blocking network read
            yield event

    view = ResponseView(slow())
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while not view.done:
            ticks += 1
            await asyncio.sleep(0.002)

    ticking = asyncio.create_task(ticker())
    response = await view
    await ticking
    assert response.output_text == "abcdefgh"
    assert threads == {"nbresponses-view-source"}
    assert ticks >= 20  # ~130 ms of blocking reads while the loop kept running


def test_sync_iterator_without_a_running_loop_is_read_at_once() -> None:
    view = ResponseView(iter(text_stream("plain script")))
    assert view.done and view.response.output_text == "plain script"


async def test_sync_iterator_exception_reaches_await() -> None:
    def broken() -> Iterator[dict[str, Any]]:
        yield from text_stream("par", complete=False)
        raise ConnectionError("connection reset")

    view = ResponseView(broken())
    with pytest.raises(ConnectionError, match="connection reset"):
        await view
    assert view.state["view"]["exception"] == {
        "type": "ConnectionError",
        "message": "connection reset",
    }
    assert view.status == "error" and view.response.output_text == "par"


async def test_async_source_exception_is_shown_and_reraised() -> None:
    async def broken() -> AsyncIterator[dict[str, Any]]:
        for event in text_stream("partial", complete=False):
            yield event
        raise RuntimeError("server went away")

    view = ResponseView(broken())
    with pytest.raises(RuntimeError, match="server went away"):
        await view
    assert "server went away" in view._repr_mimebundle_()[0]["text/html"]
    assert view.state["view"]["interrupted"]


async def test_stream_without_completed_is_interrupted() -> None:
    view = ResponseView(paced(text_stream("cut off", complete=False)))
    response = await view
    assert response.output_text == "cut off"
    assert view.state["view"]["interrupted"] and view.status == "interrupted"


def test_unknown_events_and_fields_are_shown_not_fatal() -> None:
    events = text_stream("ok")
    events[3]["brand_new_field"] = {"nested": [1, 2]}
    events.insert(4, {"type": "response.hologram.delta", "output_index": 0, "delta": "✨"})
    events.insert(5, {"type": "response.output_text.delta"})  # required fields missing
    events.insert(6, {"no_type": True})
    events.insert(7, 42)
    events.insert(
        8, {"type": "response.output_item.added", "output_index": 3, "item": {"type": "x"}}
    )
    view = ResponseView(events)
    assert view.done and view.response.output_text == "ok"
    unknown = view.state["view"]["unknown"]
    assert [u["type"] for u in unknown] == ["response.hologram.delta", "None", "None"]
    assert "TypeError" in unknown[2]["reason"]
    assert view.state["view"]["unknown_count"] == 3
    html = view._repr_mimebundle_()[0]["text/html"]
    assert "3 unrecognised event(s)" in html


def test_deltas_without_added_events_still_fold() -> None:
    events = [
        {"type": "response.reasoning_summary_text.delta", "output_index": 0, "delta": "hm"},
        {"type": "response.function_call_arguments.delta", "output_index": 1, "delta": '{"a":'},
        {"type": "response.function_call_arguments.delta", "output_index": 1, "delta": "1}"},
        {"type": "response.output_text.delta", "output_index": 2, "content_index": 1, "delta": "x"},
    ]
    view = ResponseView(events)
    output = view.state["response"]["output"]
    assert output[0]["summary"][0]["text"] == "hm"
    assert output[1] == {"type": "function_call", "id": None, "arguments": '{"a":1}'}
    assert output[2]["content"][1]["text"] == "x" and output[2]["content"][0]["text"] == ""
    assert view.state["view"]["unknown_count"] == 0


async def test_flushes_are_coalesced_to_about_twenty_a_second() -> None:
    text = "token " * 1000
    events = text_stream(text)
    started = time.perf_counter()

    async def fast() -> AsyncIterator[dict[str, Any]]:
        for n, event in enumerate(events):
            yield event
            if n % 10 == 0:
                await asyncio.sleep(0.004)  # ~2,500 events a second

    view = ResponseView(fast())
    initial = json.loads(json.dumps(view._snapshot))
    sent = capture(view)
    await view
    elapsed = time.perf_counter() - started
    assert len(sent) <= elapsed / 0.05 + 3
    assert len(sent) >= 3  # it did stream, not only send the end
    mirror = initial["state"]
    for msg in sent:
        apply_ops(mirror, msg["ops"])
    assert mirror["response"]["output"][0]["content"][0]["text"] == text


async def test_sync_request_sends_a_snapshot_mid_stream() -> None:
    gate = asyncio.Event()

    async def source() -> AsyncIterator[dict[str, Any]]:
        for event in text_stream("abc", complete=False):
            yield event
        await gate.wait()

    view = ResponseView(source(), flush_interval=10)
    sent = capture(view)
    await asyncio.sleep(0.01)
    view._on_front_end(view, {"kind": "sync"}, [])
    assert [m["kind"] for m in sent] == ["patch", "snapshot"]
    assert sent[1]["seq"] == sent[0]["seq"]
    assert sent[1]["state"]["response"]["output"][0]["content"][0]["text"] == "abc"
    gate.set()
    await view


class Cancellable:
    """A stream with the async hooks that ``show()`` looks for."""

    def __init__(self, hook: str) -> None:
        self.calls: list[str] = []
        self.hook = hook
        self.release = asyncio.Event()

    def __aiter__(self) -> Cancellable:
        self.events = iter(text_stream("never finished", complete=False))
        return self

    async def __anext__(self) -> dict[str, Any]:
        event = next(self.events, None)
        if event is None:
            await self.release.wait()
            raise StopAsyncIteration
        return event

    def __getattr__(self, name: str) -> Any:
        if name != self.hook:
            raise AttributeError(name)

        async def hook() -> None:
            self.calls.append(name)

        return hook


@pytest.mark.parametrize("hook", ["cancel", "aclose"])
async def test_cancel_detects_the_source_hook(hook: str) -> None:
    source = Cancellable(hook)
    view = ResponseView(source)
    assert view.state["view"]["cancellable"]
    await asyncio.sleep(0.01)
    view._on_front_end(view, {"kind": "cancel"}, [])  # the button
    response = await view
    assert source.calls == [hook]
    assert response.status == "cancelled" and view.status == "cancelled"
    assert response.output_text == "never finished"
    assert view._snapshot["state"]["view"]["cancelled"]


async def test_cancel_callable_and_no_button_without_a_hook() -> None:
    class Bare:
        def __aiter__(self) -> Bare:
            return self

        async def __anext__(self) -> dict[str, Any]:
            await asyncio.sleep(10)
            raise StopAsyncIteration

    assert not ResponseView(Bare()).state["view"]["cancellable"]
    called = []

    async def cancel() -> None:
        called.append(True)

    view = ResponseView(Bare(), cancel=cancel)
    assert view.state["view"]["cancellable"]
    await view.cancel()
    assert called == [True] and view.done and (await view).status == "cancelled"


async def test_cancel_stops_a_sync_source_thread() -> None:
    produced = []

    def endless() -> Iterator[dict[str, Any]]:
        yield from text_stream("x", complete=False)
        while True:
            produced.append(1)
            time.sleep(0.005)
            yield {"type": "response.output_text.delta", "output_index": 0, "delta": "."}

    hook_calls = []
    view = ResponseView(endless(), cancel=lambda: hook_calls.append(1))
    await asyncio.sleep(0.05)
    await view.cancel()
    assert hook_calls == [1] and (await view).status == "cancelled"
    count = len(produced)
    await asyncio.sleep(0.05)
    assert len(produced) <= count + 1  # the worker thread stopped


def test_finished_sources_and_bad_sources() -> None:
    events = text_stream("done")
    assert ResponseView(events).response.output_text == "done"
    final = events[-1]["response"]
    assert ResponseView(final).response.output_text == "done"
    with pytest.raises(TypeError):
        ResponseView(12)
    with pytest.raises(TypeError):
        ResponseView({"type": "response.created"})


def test_static_html_escapes_model_output() -> None:
    evil = "<script>alert(1)</script> <img src=x onerror=alert(2)> [x](javascript:alert(3))"
    events = text_stream(evil)
    events[-1]["response"]["output"][0]["content"][0]["annotations"] = [
        {"type": "url_citation", "url": "javascript:alert(4)", "title": "<b>t</b>"},
        {"type": "url_citation", "url": "https://ok.example/a?b=1&c=2", "title": "ok"},
    ]
    html = ResponseView(events)._repr_mimebundle_()[0]["text/html"]
    assert "<script" not in html and "<img" not in html and "<b>t</b>" not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert 'href="javascript' not in html
    assert (
        '<a href="https://ok.example/a?b=1&amp;c=2" target="_blank" rel="noopener noreferrer">'
        in html
    )


def test_mimebundle_has_widget_and_html() -> None:
    data, _ = ResponseView(text_stream("hi"))._repr_mimebundle_()
    assert "application/vnd.jupyter.widget-view+json" in data
    assert "hi" in data["text/html"] and "completed" in data["text/html"]


async def test_show_displays_then_refreshes_the_html_fallback(monkeypatch) -> None:
    import IPython.display

    shown: list[tuple[str, dict[str, Any]]] = []
    monkeypatch.setattr(
        IPython.display, "display", lambda data, **kw: shown.append(("display", data))
    )
    monkeypatch.setattr(
        IPython.display, "update_display", lambda data, **kw: shown.append(("update", data))
    )
    monkeypatch.setattr("nbresponses.view.widget._execution_count", lambda: 7)
    monkeypatch.setattr("nbresponses.view.widget._in_ipython", lambda: True)
    view = show(paced(text_stream("live text"), 0.001))
    assert isinstance(view, ResponseView)
    assert [kind for kind, _ in shown] == ["display"]
    assert "live text" not in shown[0][1]["text/html"]
    await view
    # refreshed when the stream ended, and again from the awaiting cell
    assert [kind for kind, _ in shown] == ["display", "update", "update"]
    assert all("live text" in data["text/html"] for _, data in shown[1:])
    # the cell's own return value is not displayed a second time
    view._ipython_display_()
    assert len(shown) == 3


def _sse(events: list[dict[str, Any]]) -> bytes:
    return "".join(f"event: {e['type']}\ndata: {json.dumps(e)}\n\n" for e in events).encode()


def _transport(events: list[dict[str, Any]]) -> httpx.MockTransport:
    def handler(request: httpx.Request) -> httpx.Response:
        headers = {"content-type": "text/event-stream"}
        return httpx.Response(200, headers=headers, content=_sse(events))

    return httpx.MockTransport(handler)


async def test_openai_sdk_async_stream() -> None:
    events = [{**e, "sequence_number": n} for n, e in enumerate(text_stream("from the SDK"))]
    client = openai.AsyncOpenAI(
        api_key="test",
        base_url="http://api.test/v1",
        http_client=httpx.AsyncClient(transport=_transport(events)),
    )
    stream = await client.responses.create(model="m", input="hi", stream=True)
    view = ResponseView(stream)
    assert view.state["view"]["cancellable"]  # AsyncStream.close() is detected
    response = await view
    assert response.output_text == "from the SDK" and response.status == "completed"


async def test_openai_sdk_sync_stream() -> None:
    events = [{**e, "sequence_number": n} for n, e in enumerate(text_stream("sync SDK"))]
    client = openai.OpenAI(
        api_key="test",
        base_url="http://api.test/v1",
        http_client=httpx.Client(transport=_transport(events)),
    )
    stream = client.responses.create(model="m", input="hi", stream=True)
    response = await ResponseView(stream)
    assert response.output_text == "sync SDK"


def test_patch_buffer_merges_appends_until_a_set() -> None:
    buffer = PatchBuffer()
    buffer.append(["a"], "x")
    buffer.append(["a"], "y")
    buffer.extend(["l"], [1])
    buffer.extend(["l"], [2])
    buffer.set(["a"], "reset")
    buffer.append(["a"], "z")
    ops = buffer.take()
    assert ops == [
        ["append", ["a"], "xy"],
        ["extend", ["l"], [1, 2]],
        ["set", ["a"], "reset"],
        ["append", ["a"], "z"],
    ]
    state = {"a": "", "l": []}
    apply_ops(state, ops)
    assert state == {"a": "resetz", "l": [1, 2]}
    assert buffer.take() == []


async def test_cancelling_an_engine_stream_shows_cancelled_with_usage(tokenizer) -> None:
    """The engine's stream sends no terminal event when cancelled (OpenAI has none): the view
    must say cancelled, not interrupted, and ``await view`` give the final status and usage."""
    from helpers.responses import client_for, ids

    from nbresponses.tokens.scripted import Script

    client, _ = client_for(tokenizer, Script(ids(tokenizer, "word " * 400), delay=0.01))
    stream = await client.responses.create(input="Talk.", stream=True)
    view = show(stream)
    while not view.state["response"]["output"]:
        await asyncio.sleep(0.01)
    await view.cancel()
    final = await view
    assert final.status == "cancelled" and view.status == "cancelled"
    assert final.usage is not None and final.usage.output_tokens > 0
    assert view.state["view"]["cancelled"] and not view.state["view"]["interrupted"]
    assert view._snapshot["state"]["response"]["usage"]["output_tokens"] > 0


def test_timings_are_shown_only_where_they_were_measured() -> None:
    """Folding a recording or a finished Response takes microseconds: the view once showed
    "first token 0.00 s · 10200000.0 tok/s · wall 0.00 s" for it. Only the Response's own
    times (created_at to completed_at) are shown then."""
    from nbresponses.view.summary import status_label, usage_line

    recording = text_stream("Hello there, this was generated long ago.")
    line = usage_line(ResponseView(recording).state)
    assert line.startswith("input 3 (1 cached)") and "tok/s" not in line
    assert "first token" not in line and "wall" not in line
    final = {**recording[-1]["response"], "object": "response"}
    final |= {"created_at": 1_700_000_000.0, "completed_at": 1_700_000_002.5}
    assert "wall 2.50 s" in usage_line(ResponseView(final).state)
    live = {"response": {"status": "in_progress"}, "view": {"phase": "streaming"}}
    assert status_label(live) == "in progress"  # not the wire's "in_progress"


def test_show_in_a_script_prints_text_not_a_mimebundle(tmp_path) -> None:
    import subprocess
    import sys
    from pathlib import Path

    script = tmp_path / "show.py"
    script.write_text(
        "import sys\n"
        f"sys.path.insert(0, {str(Path(__file__).parent)!r})\n"
        "from test_live import text_stream\n"
        "import nbresponses as nbr\n"
        "nbr.show(text_stream('Hello from a script.'))\n"
    )
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [
        "completed",
        "Hello from a script.",
        "input 3 (1 cached) · output 20",
    ]


async def test_a_finished_item_sends_only_what_changed() -> None:
    """The done item and the final Response repeat the whole text and logprobs; the patches
    carry only the new status (they sent 13 MB again for a 100,000-token answer), and still
    bring a mirror to exactly the Python state, also when a done item does change text."""
    text = "word " * 300
    events = text_stream(text)
    for event in events:
        if event["type"] == "response.output_text.delta":
            event["logprobs"] = [{"token": event["delta"], "logprob": -0.5, "top_logprobs": []}]
    changed = text_stream("other")  # its done item and Response disagree with its deltas
    changed[-2]["item"]["content"][0]["text"] = "OTHER"
    changed[-1]["response"]["output"][0]["content"][0]["text"] = "OTHER"
    changed[-2]["item"]["extra"] = {"new": 1}
    for source, expect, logprobs in ((events, text, len(text)), (changed, "OTHER", 0)):
        view = ResponseView(paced(source), flush_interval=0)
        initial = json.loads(json.dumps(view._snapshot))
        sent = capture(view)
        await view
        mirror = initial["state"]
        for msg in sent:
            apply_ops(mirror, json.loads(json.dumps(msg["ops"])))
        assert mirror == json.loads(json.dumps(view.state))
        part = view.state["response"]["output"][0]["content"][0]
        assert part["text"] == expect and len(part.get("logprobs") or []) == logprobs
        whole = [
            op
            for msg in sent
            for op in msg["ops"]
            if op[0] == "set" and op[1] == ["response", "output", 0] and op[2].get("content")
        ]
        assert whole == []  # the item was sent once, when it was added (empty), never again
