"""The built-in python tool: ``code_interpreter`` in a request, ``to=python`` in harmony.

Each response gets its own ``PythonSandbox`` (``python_sandbox.py``), started on the first call
(a response that never runs code costs no process) and closed with the response, so variables
live exactly as long as one response, like the container OpenAI creates per response.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from openai.types.responses import ResponseCodeInterpreterToolCall
from openai_harmony import Message, Role, ToolNamespaceConfig

from nbresponses.tools import python_sandbox
from nbresponses.tools.base import (
    BuiltinTool,
    ToolAnswer,
    ToolCall,
    ToolOptionError,
    tool_message,
)
from nbresponses.tools.python_sandbox import (
    DEFAULT_MEMORY,
    Isolation,
    PythonSandbox,
    SandboxUnavailable,
)

DEFAULT_TIMEOUT = 120.0  # seconds per call
MEMORY_LIMITS = {"1g": 2**30, "4g": 4 * 2**30, "16g": 16 * 2**30, "64g": 64 * 2**30}
NOT_ENABLED = "Error: the python tool is not enabled for this request."


def description(timeout: float = DEFAULT_TIMEOUT) -> str:
    """harmony's python tool text, made true of our sandbox (timeout, folder, no internet)."""
    return (
        "Use this tool to execute Python code in your chain of thought. The code will not be "
        "shown to the user. This tool should be used for internal reasoning, but not for code "
        "that is intended to be visible to the user (e.g. when creating plots, tables, or "
        "files).\n\n"
        "When you send a message containing Python code to python, it will be executed in a "
        "stateful Jupyter notebook environment. python will respond with the output of the "
        f"execution or time out after {float(timeout)} seconds. The current working directory "
        "is a temporary folder that is deleted when this response ends. Internet access for "
        "this session is disabled."
    )


class PythonTool(BuiltinTool):
    """Runs the model's code in this response's sandbox (``enabled=False``: an error answer,
    for a model that writes ``to=python`` without the request asking for code execution)."""

    name = "python"
    request_types = ("code_interpreter",)
    options = ("container",)
    item_type = "code_interpreter_call"
    item_class = ResponseCodeInterpreterToolCall
    id_prefix = "ci"
    streams_input = True
    answer_include = "code_interpreter_call.outputs"

    def __init__(
        self,
        *,
        enabled: bool = True,
        timeout: float = DEFAULT_TIMEOUT,
        memory_limit: str | None = None,
        container_id: str = "",
        isolation: Isolation = "bwrap",
    ) -> None:
        self.enabled = enabled
        self.timeout = timeout
        self.container_id = container_id
        self.isolation: Isolation = isolation
        self._memory = MEMORY_LIMITS.get(memory_limit or "", DEFAULT_MEMORY)
        self._sandbox: PythonSandbox | None = None

    @classmethod
    def unavailable(cls, **settings: Any) -> str | None:
        if settings.get("isolation", "bwrap") == "bwrap":
            problem = python_sandbox.bwrap_problem()
            if problem is not None:
                return (
                    f"code_interpreter runs model code in a sandbox, and {problem}. Install "
                    "bubblewrap, or opt out: family=HarmonyFamily(python_isolation='none') "
                    "(the code can then read what this user can)."
                )
        return None

    @classmethod
    def for_response(cls, request_tool: Any | None, **settings: Any) -> PythonTool:
        container = getattr(request_tool, "container", None)
        return cls(
            enabled=request_tool is not None,
            timeout=settings.get("timeout", DEFAULT_TIMEOUT),
            memory_limit=getattr(container, "memory_limit", None),
            container_id=settings.get("container_id", ""),
            isolation=settings.get("isolation", "bwrap"),
        )

    @classmethod
    def check_request(cls, tool: Mapping[str, Any]) -> dict[str, Any]:
        tool = super().check_request(tool)
        container = tool.setdefault("container", {"type": "auto"})
        if not isinstance(container, Mapping) or container.get("type") != "auto":
            raise ToolOptionError(
                "container", "each response gets its own local python sandbox: use "
                "{'type': 'auto'}."
            )  # fmt: skip
        for key in container:
            if key not in ("type", "memory_limit") and container[key] is not None:
                raise ToolOptionError(f"container.{key}")
        return tool

    @classmethod
    def namespace(cls, **settings: Any) -> ToolNamespaceConfig:
        timeout = settings.get("timeout", DEFAULT_TIMEOUT)
        return ToolNamespaceConfig(name=cls.name, description=description(timeout), tools=[])

    @classmethod
    def replay(cls, item: Mapping[str, Any]) -> list[Message]:
        """The code as an analysis message to python, and its logs as python's answer."""
        code = (
            Message.from_role_and_content(Role.ASSISTANT, item.get("code") or "")
            .with_channel("analysis")
            .with_recipient(cls.name)
            .with_content_type("code")
        )
        logs = [o.get("logs", "") for o in item.get("outputs") or [] if o.get("type") == "logs"]
        return [code, tool_message(cls.name, "".join(logs), channel="analysis")]

    def opening(self, call: ToolCall | None) -> dict[str, Any]:
        return {"code": "", "container_id": self.container_id, "outputs": None}

    async def run(self, call: ToolCall) -> ToolAnswer:
        if not self.enabled:
            return ToolAnswer(NOT_ENABLED, ok=False)
        if self._sandbox is None:
            self._sandbox = PythonSandbox(
                timeout=self.timeout, max_memory=self._memory, isolation=self.isolation
            )
        try:
            result = await self._sandbox.run(call.text)
        except SandboxUnavailable as exc:
            return ToolAnswer(f"Error: {exc}", ok=False)
        return ToolAnswer(result.text, item={"outputs": result.outputs()})

    async def aclose(self) -> None:
        sandbox, self._sandbox = self._sandbox, None
        if sandbox is not None:
            await sandbox.close()
