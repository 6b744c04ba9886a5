"""OpenAI-shaped errors, raised as the openai SDK's own exception classes.

Code written against the SDK catches ``openai.BadRequestError`` / ``openai.NotFoundError``; we
raise real instances of those (built on a synthetic HTTP response carrying the JSON error body
OpenAI would send) so the same ``except`` clauses, ``.code``, ``.param`` and ``.type`` work.
"""

from __future__ import annotations

import json

import openai

try:  # the openai SDK's HTTP library (httpx2 in openai 3.x, httpx before)
    import httpx2 as _http
except ImportError:  # pragma: no cover
    import httpx as _http  # type: ignore[no-redef]

_URL = "http://nbresponses.local/v1/responses"


def _error(
    cls: type[openai.APIStatusError],
    status: int,
    message: str,
    *,
    param: str | None,
    code: str | None,
    type_: str = "invalid_request_error",
) -> openai.APIStatusError:
    body = {"message": message, "type": type_, "param": param, "code": code}
    request = _http.Request("POST", _URL)
    response = _http.Response(
        status,
        request=request,
        content=json.dumps({"error": body}).encode(),
        headers={"content-type": "application/json"},
    )
    return cls(message, response=response, body=body)


def bad_request(
    message: str, *, param: str | None = None, code: str | None = None
) -> openai.BadRequestError:
    """A 400: the request is malformed or asks for something we do not support."""
    error = _error(openai.BadRequestError, 400, message, param=param, code=code)
    assert isinstance(error, openai.BadRequestError)
    return error


def not_found(
    message: str, *, param: str | None = None, code: str | None = None
) -> openai.NotFoundError:
    """A 404: no such response (never stored, deleted, evicted, or ``store=False``)."""
    error = _error(openai.NotFoundError, 404, message, param=param, code=code)
    assert isinstance(error, openai.NotFoundError)
    return error


def unsupported(param: str, detail: str = "") -> openai.BadRequestError:
    """A parameter the local engine cannot honour: named, never silently ignored."""
    message = f"nbresponses does not support the parameter '{param}'"
    return bad_request(
        message + (f": {detail}" if detail else "."), param=param, code="unsupported_parameter"
    )


def response_not_found(response_id: str, param: str = "response_id") -> openai.NotFoundError:
    return not_found(f"Response with id '{response_id}' not found.", param=param)


def server_error(message: str) -> openai.InternalServerError:
    """A 500 that says what failed (the engine stopped a generation), not a bare crash."""
    error = _error(
        openai.InternalServerError, 500, message, param=None, code="engine_error",
        type_="server_error",
    )  # fmt: skip
    assert isinstance(error, openai.InternalServerError)
    return error
