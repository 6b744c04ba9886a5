"""Python callables as function tools, and the loop that runs them.

``function_tool(fn)`` reads the name, the description (the docstring's first paragraph) and
the JSON schema of the parameters (from the signature's annotations and defaults, through
pydantic; per-parameter descriptions from Google ``Args:`` or Sphinx ``:param x:`` docstrings).

``run_tools`` creates a response, executes the function calls in its output, feeds
``function_call_output`` items back and repeats until a response makes no call, at most
``max_turns`` responses. A tool that raises, an unknown tool, arguments that are not valid
JSON / do not validate, or a call over its time limit give the model the error text instead of
crashing the loop.

How calls run, so that no tool can stall the notebook or the engine:

* the calls of one response run concurrently, their outputs in the order of the calls;
* a coroutine function is awaited; a plain function runs in a worker thread
  (``asyncio.to_thread``), so a blocking one (``time.sleep``, a slow HTTP client) leaves the
  event loop, other streams and the decode loop's hand-off running;
* every call has a time limit, ``timeout`` seconds (``function_tool(f, timeout=...)``; the
  default ``DEFAULT_TOOL_TIMEOUT`` is 60 s; None: no limit): over it, the model reads a timeout
  error. A coroutine is cancelled; a thread cannot be stopped in Python, so a plain function
  that hangs keeps its worker thread until it returns (its result is then dropped);
* cancelling the task that runs the loop cancels the calls in flight (coroutines get
  ``CancelledError``) and the response being made.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, get_type_hints

import pydantic
from openai.types.responses import Response, ResponseFunctionToolCall

DEFAULT_TOOL_TIMEOUT = 60.0  # seconds per function call


class ToolTimeout(Exception):
    """A function call ran over its time limit."""


@dataclass(frozen=True)
class FunctionToolSpec:
    """A callable with its Responses API description; pass it (or ``.param``) in ``tools``."""

    name: str
    description: str | None
    parameters: dict[str, Any]
    fn: Callable[..., Any]
    model: type[pydantic.BaseModel]
    timeout: float | None = DEFAULT_TOOL_TIMEOUT  # seconds per call; None: no limit

    @property
    def param(self) -> dict[str, Any]:
        """The ``FunctionToolParam`` dict for ``responses.create(tools=[...])``."""
        tool: dict[str, Any] = {
            "type": "function",
            "name": self.name,
            "parameters": self.parameters,
            "strict": False,
        }
        if self.description:
            tool["description"] = self.description
        return tool

    async def call(self, arguments: str) -> str:
        """Validate the model's JSON arguments, call the function (a plain one in a worker
        thread), return its output as text; ``ToolTimeout`` past ``timeout`` seconds."""
        values = self.model.model_validate_json(arguments or "{}")
        kwargs = {name: getattr(values, name) for name in type(values).model_fields}
        try:
            return _as_text(await asyncio.wait_for(self._invoke(kwargs), self.timeout))
        except asyncio.TimeoutError:
            raise ToolTimeout(f"{self.name!r} did not finish within {self.timeout:g} s") from None

    async def _invoke(self, kwargs: dict[str, Any]) -> Any:
        if inspect.iscoroutinefunction(self.fn):
            return await self.fn(**kwargs)
        result = await asyncio.to_thread(self.fn, **kwargs)
        return await result if inspect.isawaitable(result) else result

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)


def function_tool(
    fn: Callable[..., Any] | None = None,
    *,
    name: str | None = None,
    description: str | None = None,
    timeout: float | None = DEFAULT_TOOL_TIMEOUT,
) -> Any:
    """Describe a Python function as a tool; usable as ``function_tool(f)`` or a decorator.

    ``timeout``: seconds a call may take before the model is told it timed out (None: none).
    """
    if timeout is not None and not timeout > 0:
        raise ValueError(f"timeout must be a positive number of seconds or None, got {timeout!r}")
    if fn is None:
        return lambda f: function_tool(f, name=name, description=description, timeout=timeout)
    summary, param_docs = _parse_docstring(inspect.getdoc(fn) or "")
    hints = get_type_hints(fn)
    fields: dict[str, Any] = {}
    for pname, p in inspect.signature(fn).parameters.items():
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        annotation = hints.get(pname, Any)
        default = ... if p.default is p.empty else p.default
        fields[pname] = (annotation, pydantic.Field(default, description=param_docs.get(pname)))
    tool_name = name or fn.__name__
    model = pydantic.create_model(f"{tool_name}_arguments", **fields)
    schema = model.model_json_schema()
    schema.pop("title", None)
    for prop in schema.get("properties", {}).values():
        prop.pop("title", None)
    schema.setdefault("required", [])
    return FunctionToolSpec(tool_name, description or summary or None, schema, fn, model, timeout)


def _parse_docstring(doc: str) -> tuple[str, dict[str, str]]:
    """(first paragraph, {parameter: description}) from Google or Sphinx style."""
    paragraphs = doc.strip().split("\n\n")
    summary = " ".join(paragraphs[0].split()) if paragraphs and paragraphs[0] else ""
    params: dict[str, str] = {}
    for m in re.finditer(r":param\s+(\w+):\s*(.+)", doc):
        params[m.group(1)] = m.group(2).strip()
    section = re.search(r"^(?:Args|Arguments|Parameters):\s*\n((?:[ \t]+.+\n?)+)", doc, re.M)
    if section:
        for m in re.finditer(r"^[ \t]+(\w+)(?:\s*\([^)]*\))?:\s*(.+)$", section.group(1), re.M):
            params.setdefault(m.group(1), m.group(2).strip())
    if summary.startswith((":param", "Args:")):
        summary = ""
    return summary, params


def _as_text(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, pydantic.BaseModel):
        return value.model_dump_json(by_alias=True)
    try:
        return json.dumps(value)
    except (TypeError, ValueError):
        return str(value)


def as_specs(tools: Sequence[Any]) -> list[FunctionToolSpec | Mapping[str, Any]]:
    """Callables become specs; specs and tool dicts pass through (dicts have no function)."""
    return [t if isinstance(t, FunctionToolSpec | Mapping) else function_tool(t) for t in tools]


async def _output_for(call: ResponseFunctionToolCall, specs: Mapping[str, FunctionToolSpec]) -> str:
    spec = specs.get(call.name)
    if spec is None:
        return f"Error: there is no tool named {call.name!r}."
    if call.status == "incomplete":
        return f"Error: the arguments of {call.name!r} were cut off or not valid JSON."
    try:
        return await spec.call(call.arguments)
    except pydantic.ValidationError as exc:
        return f"Error: invalid arguments for {call.name!r}: {exc}"
    except ToolTimeout as exc:
        return f"Error: the tool timed out: {exc}."
    except Exception as exc:
        return f"Error: {type(exc).__name__}: {exc}"


async def run_tools(
    responses: Any, *, tools: Sequence[Any], max_turns: int = 8, **kwargs: Any
) -> Response:
    """The tool loop behind ``client.responses.run``; returns the last response.

    If ``max_turns`` responses were made and the last still calls tools, it is returned as is
    (its calls unanswered): the caller decides whether to go on.
    """
    if kwargs.get("stream") or kwargs.get("background"):
        raise ValueError("responses.run drives whole responses: no stream or background.")
    if max_turns < 1:
        raise ValueError("max_turns must be at least 1")
    specs = as_specs(tools)
    by_name = {s.name: s for s in specs if isinstance(s, FunctionToolSpec)}
    params = [s.param if isinstance(s, FunctionToolSpec) else dict(s) for s in specs]
    initial = kwargs.pop("input")
    conversation: list[Any] = (
        [{"role": "user", "content": initial}] if isinstance(initial, str) else list(initial)
    )
    response: Response | None = None
    for _ in range(max_turns):
        response = await responses.create(input=conversation, tools=params, **kwargs)
        calls = [i for i in response.output if isinstance(i, ResponseFunctionToolCall)]
        if not calls:
            return response
        conversation += [
            item.model_dump(exclude_none=True, by_alias=True) for item in response.output
        ]
        # side by side; cancelling the loop cancels them all (gather, not TaskGroup: 3.10)
        outputs = await asyncio.gather(*(_output_for(c, by_name) for c in calls))
        for call, output in zip(calls, outputs, strict=True):
            conversation.append(
                {
                    "type": "function_call_output",
                    "call_id": call.call_id,
                    "output": output,
                }
            )
    assert response is not None
    return response
