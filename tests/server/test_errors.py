"""Bad requests get OpenAI's status codes and error shape; the SSE wire format is OpenAI's."""

from __future__ import annotations

import json

import httpx2
import openai
import pytest
from helpers.responses import MODEL
from helpers.server import ThreadedServer, scripted
from openai.types.responses import ResponseStreamEvent
from pydantic import TypeAdapter

from nbresponses.server.app import create_app
from nbresponses.server.transport import ASGIStreamTransport

pytestmark = pytest.mark.timeout(60)
KEY = "sk-local-test"


def error_of(response: httpx2.Response, status: int) -> dict:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"}
    assert set(body["error"]) == {"message", "type", "param", "code"}
    assert isinstance(body["error"]["message"], str) and body["error"]["message"]
    return body["error"]


@pytest.fixture
def server(tokenizer):
    client, _ = scripted(tokenizer, "Paris.")
    with ThreadedServer(client, max_body_bytes=4096) as srv:
        yield srv


def test_malformed_and_wrong_bodies(server):
    with server.http() as http:
        post = lambda content: http.post(  # noqa: E731
            "/v1/responses", content=content, headers={"content-type": "application/json"}
        )
        err = error_of(post(b'{"input": "hi",'), 400)
        assert err["type"] == "invalid_request_error" and "JSON" in err["message"]
        assert "object" in error_of(post(b'["input"]'), 400)["message"]
        assert error_of(post(b"\xff\xfe"), 400)["type"] == "invalid_request_error"
        wrong = {
            "temperature": "hot",
            "max_output_tokens": 1.5,
            "stream": "yes",
            "tools": {"type": "function"},
            "instructions": 3,
            "timeout": 5,
            "extra_body": {},
            "nonsense": 1,
        }
        for key, value in wrong.items():
            err = error_of(post(json.dumps({"input": "hi", key: value}).encode()), 400)
            assert err["param"] == key, (key, err)
        assert error_of(post(b'{"model": "smollm2"}'), 400)["param"] == "input"
        err = error_of(post(b'{"input": "hi", "model": "gpt-x"}'), 404)
        assert err["code"] == "model_not_found"
        assert error_of(post(b'{"input": 5}'), 400)["param"] == "input"


def test_oversized_body_is_413(server):
    big = json.dumps({"input": "x" * 5000}).encode()
    with server.http() as http:
        err = error_of(http.post("/v1/responses", content=big), 413)
        assert err["code"] == "request_too_large"

        def chunks():  # no content-length: the limit holds while reading
            for _ in range(10):
                yield b" " * 1000

        error_of(http.post("/v1/responses", content=chunks()), 413)
        assert http.post("/v1/responses", json={"input": "hi"}).status_code == 200


def test_unknown_ids_routes_and_methods(server):
    with server.http() as http:
        for method, path in [
            ("GET", "/v1/responses/resp_nope"),
            ("DELETE", "/v1/responses/resp_nope"),
            ("POST", "/v1/responses/resp_nope/cancel"),
            ("GET", "/v1/responses/resp_nope/input_items"),
        ]:
            err = error_of(http.request(method, path), 404)
            assert err["param"] == "response_id" and "resp_nope" in err["message"]
        assert "Invalid URL" in error_of(http.get("/v1/nothing"), 404)["message"]
        error_of(http.put("/v1/responses"), 405)
        error_of(http.get("/v1/models/gpt-x"), 404)
        r = http.post("/v1/responses", json={"input": "hi"}).json()
        err = error_of(http.get(f"/v1/responses/{r['id']}?stream=maybe"), 400)
        assert err["param"] == "stream"
        err = error_of(http.get(f"/v1/responses/{r['id']}?stream=true&starting_after=x"), 400)
        assert err["param"] == "starting_after"
        err = error_of(http.get(f"/v1/responses/{r['id']}/input_items?limit=500"), 400)
        assert err["param"] == "limit"
        health = http.get("/health").json()
        assert health["status"] == "ok" and health["model"] == MODEL
        assert health["store"]["responses"] == 1 and health["store"]["bytes"] > 0
        assert health["source"]["requests"] == 1


def test_api_key(tokenizer):
    client, _ = scripted(tokenizer, "Paris.")
    with ThreadedServer(client, api_key=KEY) as srv, srv.http() as http:
        health = http.get("/health")  # probes need no key; the figures do
        assert health.status_code == 200 and health.json() == {"status": "ok", "model": MODEL}
        keyed = http.get("/health", headers={"authorization": f"Bearer {KEY}"}).json()
        assert set(keyed) == {"status", "model", "store", "source", "allocator", "mapped"}
        assert "API key" in error_of(http.get("/v1/models"), 401)["message"]
        err = error_of(http.get("/v1/models", headers={"authorization": "Bearer nope"}), 401)
        assert err["code"] == "invalid_api_key"
        ok = http.get("/v1/models", headers={"authorization": f"Bearer {KEY}"})
        assert ok.status_code == 200 and ok.json()["data"][0]["id"] == MODEL
        with pytest.raises(openai.AuthenticationError) as caught:
            srv.openai(sync=True, api_key="wrong").responses.create(model=MODEL, input="hi")
        assert caught.value.code == "invalid_api_key"
        r = srv.openai(sync=True, api_key=KEY).responses.create(model=MODEL, input="hi")
        assert r.output_text == "Paris."


def test_sse_wire_format_is_openais(server):
    with server.http() as http:
        body = http.post("/v1/responses", json={"input": "hi", "stream": True})
        assert body.headers["content-type"].startswith("text/event-stream")
        frames = body.text.split("\n\n")
        assert frames[-1] == ""
        adapter = TypeAdapter(ResponseStreamEvent)
        numbers = []
        for frame in frames[:-1]:
            event_line, data_line = frame.split("\n")
            assert event_line.startswith("event: ") and data_line.startswith("data: ")
            event = adapter.validate_json(data_line[len("data: ") :])
            assert event.type == event_line[len("event: ") :]
            numbers.append(event.sequence_number)
        assert numbers == list(range(len(numbers))) and event.type == "response.completed"


async def test_in_process_errors_and_mounting(tokenizer):
    """The routes mount under a prefix in a user's own Starlette app, errors and all."""
    from starlette.applications import Starlette
    from starlette.routing import Mount

    client, _ = scripted(tokenizer, "Paris.")
    api = create_app(client, api_key=KEY).state.api
    user_app = Starlette(routes=[Mount("/llm", app=api.router())])
    http = httpx2.AsyncClient(transport=ASGIStreamTransport(user_app), base_url="http://x")
    async with http:
        assert (await http.get("/llm/v1/models")).status_code == 401
        sdk = openai.AsyncOpenAI(base_url="http://x/llm/v1", api_key=KEY, http_client=http)
        r = await sdk.responses.create(model=MODEL, input="hi")
        assert r.output_text == "Paris."
        with pytest.raises(openai.BadRequestError) as caught:
            await sdk.responses.create(model=MODEL, input="hi", temperature=9)
        assert caught.value.param == "temperature" and caught.value.code == "decimal_out_of_range"
