"""The built-in browser tool: ``web_search`` in a request, ``to=browser.search/open/find`` in
harmony, run on a backend you give.

Nothing here reaches the internet by itself and no backend is enabled by default: a user who
wants gpt-oss to browse passes an object with three async methods (``BrowserBackend``). Whatever
text they return is what the model reads as the tool's answer (harmony's browser expects pages
with a ``[cursor]`` header, numbered lines and ``【id†title】`` links; a backend decides how
faithful to be).

``BrowserTool.run`` never raises for what the model asked: bad arguments or a backend error
become an ``Error: ...`` text for the model and a failed call for the protocol layer.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from openai.types.responses import ResponseFunctionWebSearch
from openai_harmony import ToolNamespaceConfig

from nbresponses.tools.base import BuiltinTool, ToolAnswer, ToolCall


@dataclass(frozen=True)
class BrowserResult:
    """A backend's answer: the text for the model and, for pages, their URL."""

    text: str
    url: str | None = None


@runtime_checkable
class BrowserBackend(Protocol):
    async def search(self, query: str, *, topn: int = 10) -> str | BrowserResult: ...

    async def open(
        self, target: str | int, *, cursor: int = -1, loc: int = -1, num_lines: int = -1
    ) -> str | BrowserResult:
        """Open a URL, or the link with this id on the page at ``cursor`` (-1: the last one)."""
        ...

    async def find(self, pattern: str, *, cursor: int = -1) -> str | BrowserResult: ...


FALLBACK_ACTIONS = {  # the action of a call whose arguments did not parse
    "search": {"type": "search"},
    "open": {"type": "open_page"},
    "find": {"type": "find_in_page", "pattern": "", "url": ""},
}
NOT_ENABLED = "Error: the browser tool is not enabled for this request."


def _int(args: dict[str, Any], key: str, default: int) -> int:
    value = args.get(key, default)
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValueError(f"'{key}' must be an integer")
    return value


def _arguments(text: str) -> dict[str, Any]:
    args = json.loads(text) if text.strip() else {}
    if not isinstance(args, dict):
        raise ValueError("arguments must be a JSON object")
    return args


def action_of(function: str, arguments: str) -> dict[str, Any]:
    """The Responses ``web_search_call.action`` of a browser call (ValueError if unparsable).

    ``open`` by link id (an int) or ``find`` leave ``url`` empty: only the tool, which knows
    the page being viewed, fills it in when the call runs.
    """
    args = _arguments(arguments)
    if function == "search":
        query = args.get("query")
        if not isinstance(query, str):
            raise ValueError("'query' must be a string")
        return {"type": "search", "query": query}
    if function == "open":
        target = args.get("id", -1)
        if not isinstance(target, str | int) or isinstance(target, bool):
            raise ValueError("'id' must be a URL or a link number")
        return {"type": "open_page", "url": target if isinstance(target, str) else None}
    if function == "find":
        pattern = args.get("pattern")
        if not isinstance(pattern, str):
            raise ValueError("'pattern' must be a string")
        return {"type": "find_in_page", "pattern": pattern, "url": ""}
    raise ValueError(f"unknown browser function {function!r}")


class BrowserTool(BuiltinTool):
    """Dispatches harmony browser calls to a backend and remembers the page being viewed
    (``backend=None``: an error answer, for a model that browses unasked)."""

    name = "browser"
    functions = ("search", "open", "find")
    request_types = (
        "web_search", "web_search_2025_08_26", "web_search_preview", "web_search_preview_2025_03_11"
    )  # fmt: skip
    item_type = "web_search_call"
    item_class = ResponseFunctionWebSearch
    id_prefix = "ws"

    def __init__(self, backend: BrowserBackend | None) -> None:
        self.backend = backend
        self.current_url: str | None = None

    @classmethod
    def unavailable(cls, **settings: Any) -> str | None:
        if settings.get("backend") is None:  # nothing browses by default
            return (
                "web_search needs a browser backend, and this client has none: "
                "family=HarmonyFamily(browser=MyBackend())."
            )
        return None

    @classmethod
    def for_response(cls, request_tool: Any | None, **settings: Any) -> BrowserTool:
        return cls(settings.get("backend") if request_tool is not None else None)

    @classmethod
    def namespace(cls, **settings: Any) -> ToolNamespaceConfig:
        return ToolNamespaceConfig.browser()

    def opening(self, call: ToolCall | None) -> dict[str, Any]:
        """The item opens when the call runs, with the action its arguments say."""
        assert call is not None, "a browser call's item opens with its arguments"
        try:
            return {"action": action_of(call.function, call.text)}
        except ValueError:
            return {"action": dict(FALLBACK_ACTIONS.get(call.function, FALLBACK_ACTIONS["search"]))}

    async def run(self, call: ToolCall) -> ToolAnswer:
        """Run ``browser.<function>`` with the model's JSON arguments; the answer's ``action``
        has the URL of the page the call showed."""
        if self.backend is None:
            return ToolAnswer(NOT_ENABLED, ok=False)
        function = call.function
        try:
            action = action_of(function, call.text)
            args = _arguments(call.text)
            if function == "search":
                result = await self.backend.search(action["query"], topn=_int(args, "topn", 10))
            elif function == "open":
                result = await self.backend.open(
                    args.get("id", -1),
                    cursor=_int(args, "cursor", -1),
                    loc=_int(args, "loc", -1),
                    num_lines=_int(args, "num_lines", -1),
                )
            else:
                result = await self.backend.find(action["pattern"], cursor=_int(args, "cursor", -1))
        except Exception as exc:  # the model reads the error and may try again
            return ToolAnswer(f"Error: {exc}", ok=False)
        if isinstance(result, BrowserResult):
            text, url = result.text, result.url
        else:
            text, url = str(result), None
        if function == "open":
            self.current_url = url or action["url"] or self.current_url
            action["url"] = self.current_url
        elif function == "find":
            action["url"] = url or self.current_url or ""
        return ToolAnswer(text, item={"action": action})
