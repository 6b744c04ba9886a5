"""The browser tool on a fake backend: dispatch, actions, errors, page tracking."""

from __future__ import annotations

from openai.types.responses import ResponseFunctionWebSearch

from nbresponses.tools import BrowserBackend, BrowserResult, BrowserTool


class FakeBackend:
    def __init__(self) -> None:
        self.calls: list[tuple] = []

    async def search(self, query: str, *, topn: int = 10) -> str:
        self.calls.append(("search", query, topn))
        return f"[0] results for {query}\n【0†Example†example.com】"

    async def open(
        self, target: str | int, *, cursor: int = -1, loc: int = -1, num_lines: int = -1
    ) -> BrowserResult:
        self.calls.append(("open", target, cursor, loc, num_lines))
        url = target if isinstance(target, str) else "https://example.com/"
        return BrowserResult(f"[1] {url}\nL0: Example Domain", url=url)

    async def find(self, pattern: str, *, cursor: int = -1) -> str:
        if pattern == "boom":
            raise RuntimeError("backend down")
        self.calls.append(("find", pattern, cursor))
        return f"[2] Find results for text: `{pattern}`"


def web_search_item(action: dict) -> ResponseFunctionWebSearch:
    item = {"id": "ws_1", "type": "web_search_call", "status": "completed", "action": action}
    return ResponseFunctionWebSearch.model_validate(item)


async def test_search_open_find_flow() -> None:
    backend = FakeBackend()
    assert isinstance(backend, BrowserBackend)
    tool = BrowserTool(backend)
    search = await tool.call("browser.search", '{"query": "gpt-oss", "topn": 3}')
    assert search.ok and search.text.startswith("[0] results for gpt-oss")
    assert search.action == {"type": "search", "query": "gpt-oss"}
    opened = await tool.call("open", '{"id": 0, "cursor": 0}')
    assert opened.action == {"type": "open_page", "url": "https://example.com/"}
    found = await tool.call("browser.find", '{"pattern": "Domain"}')
    assert found.action == {
        "type": "find_in_page",
        "pattern": "Domain",
        "url": "https://example.com/",
    }
    assert backend.calls == [
        ("search", "gpt-oss", 3),
        ("open", 0, 0, -1, -1),
        ("find", "Domain", -1),
    ]
    for call in (search, opened, found):
        assert web_search_item(call.action).status == "completed"


async def test_bad_arguments_and_backend_errors_go_back_to_the_model() -> None:
    tool = BrowserTool(FakeBackend())
    for name, args in [
        ("search", "{not json"),
        ("search", '{"topn": 2}'),
        ("open", '{"id": true}'),
        ("find", '{"pattern": "boom"}'),
        ("delete", "{}"),
    ]:
        call = await tool.call(name, args)
        assert not call.ok and call.status == "failed" and call.action is None
        assert call.text.startswith("Error: ")
