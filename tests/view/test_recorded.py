"""Replay every recorded OpenAI Responses fixture through the view and check its final state.

Expected values come from the recordings themselves (the ``response.completed`` payload, the
``*.done`` events, the full JSON bodies), never from the folder under test.
"""

from __future__ import annotations

import asyncio
import copy
import json
from typing import Any

import pytest
from helpers.recorded import find_recorded, fixtures_dir, recorded_cases, split_streams
from openai.types.responses import Response

from nbresponses.view import ResponseView
from nbresponses.view.fold import Folder
from nbresponses.view.patches import apply_ops

RECORDED = fixtures_dir()


CASES = recorded_cases() if RECORDED.is_dir() else []
STREAMS = [c for c in CASES if c[1] == "events"]
RESPONSES = [c for c in CASES if c[1] == "response"]
ids = [c[0] for c in CASES]


find = find_recorded

# --------------------------------------------------------------------------- expectations


def _terminal(events: list[dict[str, Any]]) -> dict[str, Any] | None:
    ends = ("response.completed", "response.failed", "response.incomplete")
    return next((e["response"] for e in reversed(events) if e.get("type") in ends), None)


def _texts(output: list[Any]) -> list[str]:
    return [
        part.get("text", "")
        for item in output
        if item and item.get("type") == "message"
        for part in item.get("content") or []
    ]


def _arguments(output: list[Any]) -> list[str]:
    return [
        item.get("arguments") for item in output if item and item.get("type") == "function_call"
    ]


def _expected_from_done_events(events: list[dict[str, Any]]) -> dict[str, list[str]]:
    texts = [e["text"] for e in events if e.get("type") == "response.output_text.done"]
    args = [
        e["arguments"] for e in events if e.get("type") == "response.function_call_arguments.done"
    ]
    return {"texts": texts, "arguments": args}


async def _replay(events: list[Any]) -> tuple[ResponseView, list[dict[str, Any]], dict[str, Any]]:
    async def source():
        for event in events:
            yield event
            await asyncio.sleep(0)

    view = ResponseView(source(), flush_interval=0)
    initial = copy.deepcopy(view._snapshot)
    sent: list[dict[str, Any]] = []
    view._post = sent.append  # type: ignore[method-assign]
    await view
    return view, sent, initial


# --------------------------------------------------------------------------- tests


def test_fixtures_are_all_loaded() -> None:
    notices = {"README.md", "LICENSE-Apache-2.0.txt", "LICENSE-MIT-pydantic-ai.txt"}
    names = {path.name for path in RECORDED.iterdir() if path.name not in notices}
    loaded = {case.split("#")[0] for case in ids}
    assert loaded == names
    assert len(STREAMS) >= 12 and len(RESPONSES) >= 6


@pytest.mark.parametrize(("name", "kind", "events"), STREAMS, ids=[c[0] for c in STREAMS])
async def test_stream_final_state_matches_recording(name: str, kind: str, events: list) -> None:
    view, sent, initial = await _replay(events)
    state = view.state
    final = _terminal(events)
    assert view.done
    if final is not None:
        assert state["response"]["status"] == final["status"]
        assert state["response"]["id"] == final["id"]
        assert state["response"]["usage"] == final.get("usage")
        if final.get("output"):
            assert [i["type"] for i in state["response"]["output"]] == [
                i["type"] for i in final["output"]
            ]
            assert _texts(state["response"]["output"]) == _texts(final["output"])
            assert _arguments(state["response"]["output"]) == _arguments(final["output"])
        assert not state["view"]["interrupted"]
    else:
        assert state["view"]["interrupted"]
    # The Response object users get back carries the same output.
    response = await view
    assert isinstance(response, Response)
    assert response.to_dict(warnings=False)["output"] == state["response"]["output"]
    # The front end, fed only the patches, ends with exactly the Python state.
    mirror = copy.deepcopy(initial["state"])
    seqs = [msg["seq"] for msg in sent]
    assert seqs == list(range(1, len(sent) + 1))
    for msg in sent:
        apply_ops(mirror, msg["ops"])
    assert mirror == json.loads(json.dumps(state))
    assert view._snapshot["seq"] == seqs[-1]
    assert view._snapshot["state"] == mirror


@pytest.mark.parametrize(("name", "kind", "events"), STREAMS, ids=[c[0] for c in STREAMS])
def test_deltas_alone_rebuild_text_and_arguments(name: str, kind: str, events: list) -> None:
    """Drop every ``done``/terminal event: the streamed deltas must give the same text."""
    expected = _expected_from_done_events(events)
    kept = [
        e
        for e in events
        if not e["type"].endswith(".done")
        and e["type"] not in ("response.completed", "response.failed", "response.incomplete")
    ]
    folder = Folder()
    for event in kept:
        folder.apply(event)
    output = folder.state["response"]["output"]
    if name.startswith("vercel-ai__azure"):
        # anonymised recording: every text delta became "X", the done text a placeholder
        deltas = [e for e in events if e["type"] == "response.output_text.delta"]
        assert _texts(output) == ["X" * len(deltas)]
    else:
        assert _texts(output) == expected["texts"]
    assert _arguments(output) == expected["arguments"]
    assert folder.terminal is None
    assert folder.state["view"]["unknown_count"] == 0


@pytest.mark.parametrize(("name", "kind", "body"), RESPONSES, ids=[c[0] for c in RESPONSES])
def test_finished_response(name: str, kind: str, body: dict) -> None:
    for source in (body, Response.construct(**body)):
        view = ResponseView(source)
        state = view.state
        assert view.done and not state["view"]["interrupted"]
        assert state["response"]["status"] == body.get("status")
        assert [i["type"] for i in state["response"]["output"]] == [
            i["type"] for i in body["output"]
        ]
        assert _texts(state["response"]["output"]) == _texts(body["output"])
        assert _arguments(state["response"]["output"]) == _arguments(body["output"])
        assert state["response"].get("usage") == body.get("usage")
        html = view._repr_mimebundle_()[0]["text/html"]
        for text in _texts(body["output"]):
            assert text[:40].replace("&", "&amp;").replace("<", "&lt;")[:20] in html


def test_sdk_event_models_fold_like_dicts() -> None:
    """openai SDK event objects (as an AsyncStream yields them) give the same state as dicts."""
    from openai._models import construct_type
    from openai.types.responses import ResponseStreamEvent

    events = find("vercel-ai__openai-web-search-tool.1.chunks.txt")
    models = [construct_type(type_=ResponseStreamEvent, value=e) for e in events]
    by_dict, by_model = Folder(), Folder()
    for event, model in zip(events, models, strict=True):
        by_dict.apply(event)
        by_model.apply(model)
    strip = lambda s: {**s["response"], "output": _texts(s["response"]["output"])}  # noqa: E731
    assert strip(by_model.state) == strip(by_dict.state)
    assert by_model.state["view"]["unknown_count"] == 0


def test_specific_recordings() -> None:
    code = ResponseView(find("vercel-ai__openai-code-interpreter-tool.1.chunks.txt"))
    calls = [i for i in code.state["response"]["output"] if i["type"] == "code_interpreter_call"]
    assert len(calls) == 3 and all(c["code"] and c["status"] == "completed" for c in calls)

    web = ResponseView(find("vercel-ai__openai-web-search-tool.1.chunks.txt"))
    parts = [
        p for i in web.state["response"]["output"] if i["type"] == "message" for p in i["content"]
    ]
    assert any(a["type"] == "url_citation" for p in parts for a in p["annotations"])
    searches = [i for i in web.state["response"]["output"] if i["type"] == "web_search_call"]
    assert len(searches) == 4 and {s["status"] for s in searches} == {"completed"}

    error = ResponseView(find("vercel-ai__openai-error.1.chunks.txt"))
    assert error.status.startswith("failed")
    assert error.state["view"]["errors"][0]["code"] == "insufficient_quota"

    failed = ResponseView(find("vercel-ai__openai-response-failed-only.1.chunks.txt"))
    assert failed.state["response"]["error"]["code"] == "rate_limit_exceeded"

    azure_events = find("vercel-ai__azure-gpt5-reasoning-multi-summary")
    azure = ResponseView(azure_events)
    reasoning = next(i for i in azure.state["response"]["output"] if i["type"] == "reasoning")
    assert len(reasoning["summary"]) == 3
    deltas = sum(1 for e in azure_events if e["type"] == "response.output_text.delta")
    message_index = next(
        n for n, i in enumerate(azure.state["response"]["output"]) if i["type"] == "message"
    )
    assert azure.state["view"]["items"][message_index]["deltas"] == deltas == 1105

    cot = ResponseView(find("pydantic-ai__test_openai_responses_raw_cot_stream_openrouter"))
    item = next(i for i in cot.state["response"]["output"] if i["type"] == "reasoning")
    assert item["content"][0]["type"] == "reasoning_text" and item["content"][0]["text"]

    tool = ResponseView(find("vercel-ai__issue-19493-gpt-5.1-tool-call"))
    assert [
        i["name"] for i in tool.state["response"]["output"] if i["type"] == "function_call"
    ] == ["get_weather"]
    assert tool.response.output_text == ""

    logprobs = ResponseView(find("pydantic-ai__test_openai_instructions_with_responses_logprobs"))
    part = logprobs.state["response"]["output"][0]["content"][0]
    assert part["logprobs"] and "".join(lp["token"] for lp in part["logprobs"]) == part["text"]
    assert all(isinstance(lp["logprob"], float) for lp in part["logprobs"])


def test_multi_stream_file_keeps_the_last_turn() -> None:
    """Concatenated streams (a tool loop) fold into the response of the last turn."""
    path = RECORDED / "vercel-ai__openai-reasoning-encrypted-content.1.chunks.txt"
    events = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    view = ResponseView(events)
    last = _terminal(split_streams(events)[-1])
    assert last is not None
    assert view.state["response"]["id"] == last["id"]
    assert view.response.output_text == Response.construct(**last).output_text
