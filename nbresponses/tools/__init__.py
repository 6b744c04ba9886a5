"""Built-in tools gpt-oss models call through harmony: a python sandbox and a pluggable browser.

Each is one class on the ``BuiltinTool`` protocol (``base.py``), listed in ``registry.py``.
"""

from nbresponses.tools.base import BuiltinTool, ToolAnswer, ToolCall, ToolOptionError
from nbresponses.tools.browser import BrowserBackend, BrowserResult, BrowserTool
from nbresponses.tools.python import PythonTool
from nbresponses.tools.python_sandbox import PythonSandbox, SandboxResult

__all__ = [
    "BrowserBackend",
    "BrowserResult",
    "BrowserTool",
    "BuiltinTool",
    "PythonSandbox",
    "PythonTool",
    "SandboxResult",
    "ToolAnswer",
    "ToolCall",
    "ToolOptionError",
]
