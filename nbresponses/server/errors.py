"""OpenAI's error shape over HTTP: ``{"error": {"message", "type", "param", "code"}}``.

The service (``service/``) raises the openai SDK's own ``APIStatusError`` subclasses, which already
carry the status and the body OpenAI would send; here they become JSON responses, so a program
on the other side of the socket catches the same ``openai.BadRequestError`` as one in process.
"""

from __future__ import annotations

from typing import Any

import openai
from starlette.responses import JSONResponse

TYPES = {
    400: "invalid_request_error",
    401: "invalid_request_error",
    403: "invalid_request_error",
    404: "invalid_request_error",
    405: "invalid_request_error",
    409: "invalid_request_error",
    413: "invalid_request_error",
    500: "server_error",
    503: "server_error",
}


class HTTPError(Exception):
    """An error a route raises to answer with ``status`` and OpenAI's error body."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        type_: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.body = {
            "message": message,
            "type": type_ or TYPES.get(status, "invalid_request_error"),
            "param": param,
            "code": code,
        }


def error_response(status: int, body: dict[str, Any]) -> JSONResponse:
    """The error as JSON; text that is not valid Unicode (a message quoting a lone surrogate
    the request sent) is escaped, so that explaining a bad request cannot fail itself."""
    clean = {
        key: value.encode("utf-8", "backslashreplace").decode() if isinstance(value, str) else value
        for key, value in body.items()
    }
    return JSONResponse({"error": clean}, status_code=status)


def describe(exc: BaseException) -> tuple[int, dict[str, Any]]:
    """The status and error body for anything a route raised; unknown failures are a 500."""
    if isinstance(exc, HTTPError):
        return exc.status, exc.body
    if isinstance(exc, openai.APIStatusError):
        body = exc.body if isinstance(exc.body, dict) else {}
        return (
            exc.status_code,
            {
                "message": body.get("message", exc.message),
                "type": body.get("type", TYPES.get(exc.status_code, "invalid_request_error")),
                "param": body.get("param"),
                "code": body.get("code"),
            },
        )
    return (
        500,
        {
            "message": f"The server had an error while processing your request "
            f"({type(exc).__name__}).",
            "type": "server_error",
            "param": None,
            "code": None,
        },
    )


def from_exception(exc: BaseException) -> JSONResponse:
    return error_response(*describe(exc))
