"""The built-in tools this package has, and the lookups every layer makes in them.

Request validation asks which tool a ``tools[].type`` enables; input items, which class an item
type is; harmony rendering, how each enabled tool is described and how an earlier item replays;
harmony parsing, which tool a recipient is. Adding a tool is adding its class here.
"""

from __future__ import annotations

from nbresponses.tools.base import BuiltinTool
from nbresponses.tools.browser import BrowserTool
from nbresponses.tools.python import PythonTool

# In the order harmony's system message lists them (browser, then python).
BUILTIN_TOOLS: tuple[type[BuiltinTool], ...] = (BrowserTool, PythonTool)


def for_request_type(kind: str) -> type[BuiltinTool] | None:
    """The tool a request's ``tools[].type`` enables (``code_interpreter``, ``web_search``...)."""
    return next((t for t in BUILTIN_TOOLS if kind in t.request_types), None)


def for_item_type(kind: str) -> type[BuiltinTool] | None:
    """The tool whose calls make output items of this type."""
    return next((t for t in BUILTIN_TOOLS if t.item_type == kind), None)


def for_recipient(recipient: str) -> tuple[type[BuiltinTool], str] | None:
    """(tool, function) a harmony recipient (``python``, ``browser.search``) addresses."""
    for tool in BUILTIN_TOOLS:
        function = tool.recipient(recipient)
        if function is not None:
            return tool, function
    return None


def item_types() -> tuple[str, ...]:
    return tuple(t.item_type for t in BUILTIN_TOOLS)
