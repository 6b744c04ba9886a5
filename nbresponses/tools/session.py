"""One response's built-in tools: its own python sandbox and browser session.

The sandbox starts on the first python call (a response that never runs code costs no
process) and is closed with the response, so variables live exactly as long as one response,
like a container OpenAI creates per response. A tool the request did not enable is never run:
the model gets an error text instead (a model may try ``to=python`` unprompted).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from nbresponses.tools.browser import BrowserBackend, BrowserCall, BrowserTool
from nbresponses.tools.python_sandbox import PythonSandbox

MEMORY_LIMITS = {"1g": 2**30, "4g": 4 * 2**30, "16g": 16 * 2**30, "64g": 64 * 2**30}


@dataclass(frozen=True)
class PythonRun:
    """What a python call gave: the model's text and the Responses ``outputs``."""

    text: str
    outputs: list[dict[str, Any]] = field(default_factory=list)
    ok: bool = True


class BuiltinTools:
    """``python`` / ``browse`` for one response; ``aclose`` when the response ends."""

    def __init__(
        self,
        *,
        python: bool,
        python_timeout: float,
        memory_limit: str | None = None,
        browser: BrowserBackend | None = None,
    ) -> None:
        self._python = python
        self._timeout = python_timeout
        self._memory = MEMORY_LIMITS.get(memory_limit or "")
        self._sandbox: PythonSandbox | None = None
        self._browser = BrowserTool(browser) if browser is not None else None

    async def python(self, code: str) -> PythonRun:
        if not self._python:
            return PythonRun("Error: the python tool is not enabled for this request.", ok=False)
        if self._sandbox is None:
            self._sandbox = PythonSandbox(timeout=self._timeout, max_memory=self._memory)
        result = await self._sandbox.run(code)
        return PythonRun(result.text, result.outputs())

    async def browse(self, name: str, arguments: str) -> BrowserCall:
        if self._browser is None:
            text = "Error: the browser tool is not enabled for this request."
            return BrowserCall(name, text, None, ok=False)
        return await self._browser.call(name, arguments)

    async def aclose(self) -> None:
        sandbox, self._sandbox = self._sandbox, None
        if sandbox is not None:
            await sandbox.close()
