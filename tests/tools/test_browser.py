"""The browser tool on a fake backend: dispatch, actions, errors, page tracking."""

from __future__ import annotations

from openai.types.responses import ResponseFunctionWebSearch

from nbresponses.tools import BrowserBackend, BrowserResult, BrowserTool, ToolCall


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
    assert (
        BrowserTool.recipient("browser.search") == "search" and BrowserTool.recipient("x") is None
    )
    search = await tool.run(ToolCall("search", '{"query": "gpt-oss", "topn": 3}'))
    assert search.ok and search.text.startswith("[0] results for gpt-oss")
    assert search.item["action"] == {"type": "search", "query": "gpt-oss"}
    opened = await tool.run(ToolCall("open", '{"id": 0, "cursor": 0}'))
    assert opened.item["action"] == {"type": "open_page", "url": "https://example.com/"}
    found = await tool.run(ToolCall("find", '{"pattern": "Domain"}'))
    assert found.item["action"] == {
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
        assert web_search_item(call.item["action"]).status == "completed"


async def test_bad_arguments_and_backend_errors_go_back_to_the_model() -> None:
    tool = BrowserTool(FakeBackend())
    for name, args in [
        ("search", "{not json"),
        ("search", '{"topn": 2}'),
        ("open", '{"id": true}'),
        ("find", '{"pattern": "boom"}'),
        ("delete", "{}"),
    ]:
        answer = await tool.run(ToolCall(name, args))
        assert not answer.ok and answer.item == {}
        assert answer.text.startswith("Error: ")
        # the item still gets an action: the one its arguments say, or the function's fallback
        assert tool.opening(ToolCall(name, args))["action"]["type"] in (
            "search", "open_page", "find_in_page"
        )  # fmt: skip


async def test_without_a_backend_the_model_is_told_so() -> None:
    answer = await BrowserTool.for_response(None, backend=FakeBackend()).run(
        ToolCall("search", '{"query": "x"}')
    )
    assert not answer.ok and "not enabled" in answer.text
