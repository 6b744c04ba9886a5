"""Built-in tools gpt-oss models call through harmony: a python sandbox and a pluggable browser."""

from nbresponses.tools.browser import BrowserBackend, BrowserCall, BrowserResult, BrowserTool
from nbresponses.tools.python_sandbox import PythonSandbox, SandboxResult

__all__ = [
    "BrowserBackend",
    "BrowserCall",
    "BrowserResult",
    "BrowserTool",
    "PythonSandbox",
    "SandboxResult",
]
