"""The built-in browser tool: the model's ``browser.search/open/find`` calls, on a backend you give.

Nothing here reaches the internet by itself and no backend is enabled by default: a user who
wants gpt-oss to browse passes an object with three async methods (``BrowserBackend``). Whatever
text they return is what the model reads as the tool's answer (harmony's browser expects pages
with a ``[cursor]`` header, numbered lines and ``【id†title】`` links; a backend decides how
faithful to be).

``BrowserTool.call`` never raises for what the model asked: bad arguments or a backend error
become an ``Error: ...`` text for the model and a failed call for the protocol layer.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable


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


@dataclass(frozen=True)
class BrowserCall:
    """One executed call: the model's answer text and the Responses ``web_search_call`` action."""

    name: str  # search / open / find
    text: str
    action: dict[str, Any] | None
    ok: bool

    @property
    def status(self) -> str:
        return "completed" if self.ok else "failed"


def _int(args: dict[str, Any], key: str, default: int) -> int:
    value = args.get(key, default)
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValueError(f"'{key}' must be an integer")
    return value


class BrowserTool:
    """Dispatches harmony browser calls to a backend and remembers the page being viewed."""

    def __init__(self, backend: BrowserBackend) -> None:
        self.backend = backend
        self.current_url: str | None = None

    async def call(self, name: str, arguments: str) -> BrowserCall:
        """Run ``browser.<name>`` with the model's JSON ``arguments``."""
        name = name.removeprefix("browser.")
        try:
            args = json.loads(arguments) if arguments.strip() else {}
            if not isinstance(args, dict):
                raise ValueError("arguments must be a JSON object")
            if name == "search":
                query = args.get("query")
                if not isinstance(query, str):
                    raise ValueError("'query' must be a string")
                action: dict[str, Any] = {"type": "search", "query": query}
                result = await self.backend.search(query, topn=_int(args, "topn", 10))
            elif name == "open":
                target = args.get("id", -1)
                if not isinstance(target, str | int) or isinstance(target, bool):
                    raise ValueError("'id' must be a URL or a link number")
                result = await self.backend.open(
                    target,
                    cursor=_int(args, "cursor", -1),
                    loc=_int(args, "loc", -1),
                    num_lines=_int(args, "num_lines", -1),
                )
                action = {"type": "open_page", "url": target if isinstance(target, str) else None}
            elif name == "find":
                pattern = args.get("pattern")
                if not isinstance(pattern, str):
                    raise ValueError("'pattern' must be a string")
                result = await self.backend.find(pattern, cursor=_int(args, "cursor", -1))
                action = {"type": "find_in_page", "pattern": pattern, "url": ""}
            else:
                raise ValueError(f"unknown browser function {name!r}")
        except Exception as exc:  # the model reads the error and may try again
            return BrowserCall(name, f"Error: {exc}", None, ok=False)
        if isinstance(result, BrowserResult):
            text, url = result.text, result.url
        else:
            text, url = str(result), None
        if name == "open":
            self.current_url = url or action["url"] or self.current_url
            action["url"] = self.current_url
        elif name == "find":
            action["url"] = url or self.current_url or ""
        return BrowserCall(name, text, action, ok=True)
