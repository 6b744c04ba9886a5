"""Generated request bodies and queries against the HTTP app: every answer is a 2xx or an
OpenAI-shaped 4xx naming what was wrong, never a 5xx (hypothesis)."""

from __future__ import annotations

import json
import os
from typing import Any

import pytest
from helpers.responses import MODEL
from helpers.server import ThreadedServer, scripted
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nbresponses.protocol.request import SDK_PARAMETERS

pytestmark = pytest.mark.timeout(600)

# every character, lone surrogates included (JSON can carry them as \ud800 escapes)
TEXT = st.text(st.characters(codec=None, exclude_categories=()), max_size=12)
NAMES = st.sampled_from(["f", "get_weather", "", "x" * 70])
SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | TEXT
)
JSON = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(TEXT, inner, max_size=4),
    max_leaves=12,
)
ITEM_TYPES = [
    "message",
    "function_call",
    "function_call_output",
    "reasoning",
    "code_interpreter_call",
    "web_search_call",
    "input_text",
    "bogus",
]
ITEM = st.fixed_dictionaries(
    {},
    optional={
        "type": st.sampled_from(ITEM_TYPES) | JSON,
        "role": st.sampled_from(["user", "assistant", "system", "developer", "tool"]) | JSON,
        "content": TEXT
        | st.lists(
            st.fixed_dictionaries(
                {
                    "type": st.sampled_from(["input_text", "output_text", "input_image"]) | JSON,
                    "text": TEXT | JSON,
                }
            ),
            max_size=3,
        )
        | JSON,
        "call_id": st.sampled_from(["call_1", "call_2"]) | JSON,
        "name": NAMES | JSON,
        "arguments": st.sampled_from(["{}", '{"a": 1}', "not json"]) | JSON,
        "output": TEXT | JSON,
        "id": TEXT | JSON,
        "status": st.sampled_from(["completed", "incomplete", "in_progress"]) | JSON,
        "summary": JSON,
        "code": TEXT,
        "outputs": JSON,
    },
)
TOOL = st.fixed_dictionaries(
    {"type": st.sampled_from(["function", "code_interpreter", "web_search", "mcp"]) | JSON},
    optional={
        "name": NAMES | JSON,
        "parameters": JSON,
        "description": TEXT | JSON,
        "strict": JSON,
        "container": JSON,
    },
)
VALUES: dict[str, st.SearchStrategy[Any]] = {
    "input": TEXT | st.lists(ITEM, max_size=4) | JSON,
    "instructions": TEXT | JSON,
    "model": st.just(MODEL) | TEXT,
    "tools": st.lists(TOOL, max_size=3) | JSON,
    "tool_choice": st.sampled_from(["none", "auto", "required"])
    | st.fixed_dictionaries({"type": st.just("function"), "name": NAMES})
    | JSON,
    "text": st.fixed_dictionaries(
        {},
        optional={
            "format": JSON
            | st.fixed_dictionaries(
                {"type": st.sampled_from(["text", "json_object", "json_schema"])}
            )
        },
    )
    | JSON,
    "include": st.lists(st.sampled_from(["message.output_text.logprobs", "x"]) | JSON) | JSON,
    "top_logprobs": st.integers(-2, 30) | JSON,
    "temperature": st.floats(-1, 3) | JSON,
    "max_output_tokens": st.integers(-2, 10) | JSON,
    "stream": st.booleans() | JSON,
    "stream_options": st.fixed_dictionaries({}, optional={"include_obfuscation": JSON}) | JSON,
    "background": st.booleans() | JSON,
    "store": st.booleans() | JSON,
    "metadata": st.dictionaries(TEXT, TEXT | JSON, max_size=3) | JSON,
    "reasoning": st.fixed_dictionaries({}, optional={"effort": TEXT | JSON}) | JSON,
    "previous_response_id": st.sampled_from(["resp_nope"]) | JSON,
}
KEYS = sorted(SDK_PARAMETERS | {"nonsense"})
BODY = st.fixed_dictionaries(
    {"input": VALUES["input"]},
    optional={key: VALUES.get(key, JSON) for key in KEYS if key != "input"},
)
RAW = st.binary(max_size=64) | st.builds(
    lambda depth, key: (f'{{"{key}": ' + "[" * depth + "]" * depth + "}").encode(),
    st.integers(1, 3000),
    st.sampled_from(["input", "metadata", "tools"]),
)


@pytest.fixture(scope="module")
def server(tokenizer):
    client, _ = scripted(tokenizer, "Paris.")
    with ThreadedServer(client) as srv, srv.http() as http:
        yield http


def check(response: Any) -> None:
    """2xx, or a 4xx with OpenAI's error shape."""
    assert response.status_code < 500, response.text
    if response.status_code >= 400:
        error = response.json()["error"]
        assert set(error) == {"message", "type", "param", "code"} and error["message"]


SETTINGS = settings(
    max_examples=int(os.environ.get("NBR_FUZZ_EXAMPLES", "250")),  # more: a deeper search
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)


@pytest.mark.slow
@SETTINGS
@given(body=BODY)
def test_generated_bodies_never_give_a_server_error(server: Any, body: dict[str, Any]) -> None:
    content = json.dumps(body, allow_nan=True).encode()
    with server.stream(
        "POST", "/v1/responses", content=content, headers={"content-type": "application/json"}
    ) as response:
        response.read()  # a stream's events, to the end
        check(response)


@pytest.mark.slow
@SETTINGS
@given(raw=RAW)
def test_raw_bytes_and_deep_nesting_never_give_a_server_error(server: Any, raw: bytes) -> None:
    check(server.post("/v1/responses", content=raw, headers={"content-type": "application/json"}))


QUERY = st.dictionaries(
    st.sampled_from(
        [
            "stream",
            "starting_after",
            "include",
            "include[]",
            "limit",
            "order",
            "after",
            "include_obfuscation",
        ]
    ),
    st.text(max_size=8) | st.integers(-5, 50).map(str) | st.sampled_from(["true", "false"]),
    max_size=4,
)


@pytest.mark.slow
@SETTINGS
@given(query=QUERY, known=st.booleans(), route=st.sampled_from(["", "/input_items", "/cancel"]))
def test_generated_queries_never_give_a_server_error(
    server: Any, query: dict[str, str], known: bool, route: str
) -> None:
    response_id = "resp_nope"
    if known:
        created = server.post("/v1/responses", json={"input": "hi", "background": True})
        response_id = created.json()["id"]
    url = f"/v1/responses/{response_id}{route}"
    if route == "/cancel":
        check(server.post(url))
    else:
        with server.stream("GET", url, params=query) as response:
            response.read()
            check(response)
