"""The protocol of a built-in tool: one class says everything about it, the rest reads a registry.

A built-in tool is one the model calls by name (through harmony: ``to=python``,
``to=browser.search``) and the engine runs inside the response, as OpenAI runs its hosted tools.
Modelled on gpt-oss's ``Tool``: a class declares what enables it in a request
(``request_types``), the output item a call makes (``item_type``, ``item_class``), how it is
addressed and described to the model (``name``, ``functions``, ``namespace``), how an earlier
call reads back into a later prompt (``replay``), the item's fields when a call opens and when
one is given up (``opening``), and an instance runs calls (``run``) for one response.

Request validation (``protocol/request.py``), input items (``protocol/items.py``), harmony
rendering and parsing (``families/harmony``) all look tools up in ``registry.py``; adding a
tool is one class here and one entry there (plus its item's stream events in
``protocol/events.py`` when it has some of its own).

Tools import no other part of this package: what they raise for a bad request option is a
``ToolOptionError`` that the protocol turns into an OpenAI-shaped 400.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from openai_harmony import Author, Message, Role, ToolNamespaceConfig
from pydantic import BaseModel


class ToolOptionError(ValueError):
    """A request's tool entry asks for an option a local run cannot honour.

    ``param`` is relative to the tool entry (``"container.file_ids"``); ``detail`` says what
    would work instead, when something would.
    """

    def __init__(self, param: str, detail: str = "") -> None:
        super().__init__(f"{param}: {detail}" if detail else param)
        self.param = param
        self.detail = detail


@dataclass(frozen=True)
class ToolCall:
    """What the model sent: the function within the tool's namespace ("" for a tool addressed
    by its name alone, like python) and its text (the code, or JSON arguments)."""

    function: str
    text: str


@dataclass(frozen=True)
class ToolAnswer:
    """A call's outcome: the text the model reads back, whether it worked, and the fields its
    output item gets when it closes (``outputs`` of a code call, ``action`` of a search)."""

    text: str
    ok: bool = True
    item: dict[str, Any] = field(default_factory=dict)


def tool_message(author: str, text: str, *, channel: str) -> Message:
    """A tool's answer to the assistant in harmony; ``author`` is the recipient it answers
    (``python``, ``browser.search``, ``functions.get_weather``)."""
    return (
        Message.from_author_and_content(Author.new(Role.TOOL, author), text)
        .with_recipient("assistant")
        .with_channel(channel)
    )


class BuiltinTool(ABC):
    """One built-in tool; an instance serves the calls of one response."""

    name: ClassVar[str]  # harmony recipient, or its namespace: "python", "browser"
    functions: ClassVar[tuple[str, ...]] = ()  # "browser.search" ...; () if addressed by name
    request_types: ClassVar[tuple[str, ...]]  # Responses ``tools[].type`` values enabling it
    options: ClassVar[tuple[str, ...]] = ()  # keys of a request's tool entry it honours
    item_type: ClassVar[str]  # the output item of a call
    item_class: ClassVar[type[BaseModel]]
    id_prefix: ClassVar[str]  # of that item's id
    streams_input: ClassVar[bool] = False  # the call's text streams into the item (code)
    # the ``include`` value a request must list to get the answer's fields on the item (the
    # model still sees them in later turns); None: always on the item
    answer_include: ClassVar[str | None] = None

    # -- what the classes know --------------------------------------------------------------

    @classmethod
    @abstractmethod
    def for_response(cls, request_tool: Any | None, **settings: Any) -> BuiltinTool:
        """The tool for one response: ``request_tool`` is the request's entry enabling it (None
        when the request did not: calls then get an error answer); ``settings`` are the
        family's (``timeout`` for python, ``backend`` for the browser), each takes its own."""

    @classmethod
    def check_request(cls, tool: Mapping[str, Any]) -> dict[str, Any]:
        """A request's tool entry, normalised; ``ToolOptionError`` for what cannot be served."""
        for key, value in tool.items():
            if key != "type" and key not in cls.options and value is not None:
                raise ToolOptionError(key)
        return dict(tool)

    @classmethod
    def unavailable(cls, **settings: Any) -> str | None:
        """Why a request cannot enable this tool with these settings (None: it can)."""
        return None

    @classmethod
    def address(cls, function: str) -> str:
        """The harmony recipient of one of its functions (``browser.search``, ``python``)."""
        return f"{cls.name}.{function}" if function else cls.name

    @classmethod
    def recipient(cls, recipient: str) -> str | None:
        """The function a harmony recipient calls on this tool ("" for the tool itself), or
        None when the recipient is not this tool's."""
        if not cls.functions:
            return "" if recipient == cls.name else None
        function = recipient.removeprefix(f"{cls.name}.")
        return function if function != recipient and function in cls.functions else None

    @classmethod
    @abstractmethod
    def namespace(cls, **settings: Any) -> ToolNamespaceConfig:
        """How the tool is described to the model in the system message."""

    @classmethod
    def replay(cls, item: Mapping[str, Any]) -> list[Message]:
        """An earlier call's item as the harmony messages a later prompt shows the model
        (none when the item does not hold what the model saw)."""
        return []

    # -- what an instance does --------------------------------------------------------------

    def opening(self, call: ToolCall | None) -> dict[str, Any]:
        """The fields of the call's item when it opens (``call`` is None when the call's
        text is still to stream) or when a call that will not run is given up."""
        return {}

    @abstractmethod
    async def run(self, call: ToolCall) -> ToolAnswer:
        """Run one call. Never raises for what the model asked: errors are answers."""

    async def aclose(self) -> None:
        """Release what the calls of this response held."""
        return None
