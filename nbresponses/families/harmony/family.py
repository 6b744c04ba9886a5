"""gpt-oss models: harmony rendering, harmony segments → events, built-in tool rounds.

Segments map to output items: ``analysis`` → reasoning (``reasoning_text``); ``final`` and
``commentary`` text → messages with ``phase`` "final_answer" / "commentary"; a message to
``functions.NAME`` → a ``function_call`` (the response ends; the caller answers with
``function_call_output``); to a built-in tool (``tools/registry.py``: ``python``,
``browser.*``) → that tool's item (``code_interpreter_call``, ``web_search_call``). Built-in
calls run within the response: the tool's answer is appended to prompt + output and the model
goes on, at most ``max_tool_calls`` times (a call beyond that is left ``incomplete`` and the
response ends). Tokens outside any message count in usage only.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from openai_harmony import HarmonyEncoding, Message

from nbresponses.families.base import RenderedPrompt
from nbresponses.families.constrain import output_schema, tool_schemas
from nbresponses.families.harmony import (
    Event,
    HarmonyStreamParser,
    SegmentDelta,
    SegmentEnd,
    SegmentStart,
    continuation_ids,
    harmony_encoding,
    render_request,
)
from nbresponses.families.harmony.grammar import (
    grammar_tokenizer,
    harmony_grammar,
    response_format_section,
)
from nbresponses.families.harmony.token_bytes import HarmonyTokenBytes
from nbresponses.families.text import protocol_logprob
from nbresponses.grammar import Grammar, Guard
from nbresponses.protocol.errors import bad_request
from nbresponses.protocol.events import EventBuilder, ItemStatus, TokenLogprob
from nbresponses.protocol.ids import new_id
from nbresponses.protocol.request import CreateRequest
from nbresponses.tokens.contract import TokenIdLogprob
from nbresponses.tools import registry
from nbresponses.tools.base import BuiltinTool, ToolCall, tool_message
from nbresponses.tools.python import DEFAULT_TIMEOUT
from nbresponses.tools.python_sandbox import Isolation


class HarmonyFamily:
    """The family of gpt-oss models (``model_type == "gpt_oss"``).

    Its built-in tools' settings: ``browser`` (a ``BrowserBackend``: without one, a request
    enabling ``web_search`` is a 400), ``python_timeout`` (seconds per python call) and
    ``max_tool_calls`` (built-in calls per response; a request may ask for fewer) and
    ``python_isolation`` ("bwrap", the default: the sandbox's own namespaces; "none" opts out,
    see ``tools/python_sandbox.py``).
    """

    name = "harmony"

    def __init__(
        self,
        encoding: HarmonyEncoding | None = None,
        *,
        browser: Any = None,
        python_timeout: float = DEFAULT_TIMEOUT,
        python_isolation: Isolation = "bwrap",
        max_tool_calls: int = 16,
        eos_token_ids: Iterable[int] = (),
    ) -> None:
        self.encoding = encoding if encoding is not None else harmony_encoding()
        self.settings: dict[str, Any] = {
            "backend": browser,
            "timeout": python_timeout,
            "isolation": python_isolation,
        }
        self.max_tool_calls = max_tool_calls
        self._bytes = HarmonyTokenBytes(self.encoding)
        self._stops = tuple(self.encoding.stop_tokens_for_assistant_actions())
        # end-of-text ids the engine may stop on that harmony's grammar does not read
        self._skip = frozenset(eos_token_ids) - set(self._stops)

    def check(self, req: CreateRequest, conversation: Sequence[Any]) -> None:
        output_schema(req)  # a 400 for a schema (or tool schema) that cannot be enforced
        if req.tool_mode != "none":
            tool_schemas(req)
        for i, tool in enumerate(req.all_tools):
            builtin = registry.for_request_type(tool.type)
            problem = builtin.unavailable(**self.settings) if builtin is not None else None
            if problem is not None:
                raise bad_request(f"'tools[{i}]': {problem}", param=f"tools[{i}]")

    def encode(self, text: str) -> list[int]:
        return list(self.encoding.encode(text, allowed_special="all"))

    def decode(self, token_ids: Sequence[int]) -> str:
        return self.encoding.decode(list(token_ids))

    def token_logprob(self, logprob: TokenIdLogprob) -> TokenLogprob:
        return protocol_logprob(logprob, self._bytes)

    def render(self, req: CreateRequest, conversation: Sequence[Any]) -> RenderedPrompt:
        tools_on = req.tool_mode != "none"
        given = {
            registry.for_request_type(t.type): t for t in req.builtin_tools if tools_on
        }  # the request's entry of each built-in tool it enables
        try:
            prompt = render_request(
                self.encoding,
                list(conversation),
                instructions=req.instructions,
                tools=[t.model_dump(exclude_none=True) for t in req.tools] if tools_on else [],
                reasoning=req.reasoning,
                builtin=[
                    t.namespace(**self.settings) for t in registry.BUILTIN_TOOLS if t in given
                ],
                response_format=response_format_section(req.text_format),
            )
        except ValueError as exc:
            raise bad_request(
                f"Cannot render this conversation for gpt-oss: {exc}", param="input"
            ) from None
        limit = min(self.max_tool_calls, req.max_tool_calls or self.max_tool_calls)

        def output_reader(builder: EventBuilder) -> HarmonyOutputReader:
            settings = {**self.settings, "container_id": new_id("cntr")}  # one per response
            tools = {
                t.item_type: t.for_response(given.get(t), **settings)
                for t in registry.BUILTIN_TOOLS
            }
            return HarmonyOutputReader(
                builder,
                self.encoding,
                self._bytes,
                tools,
                include=frozenset(req.include),
                max_tool_calls=limit,
                skip=self._skip,
            )

        tools = tool_schemas(req) if tools_on else []
        grammar = harmony_grammar(output_schema(req), tools, req, builtin=prompt.builtin)
        tokenizer = grammar_tokenizer(self.encoding)
        guard = Guard(req.repetition_guard)  # harmony's turn is watched whole
        constraint = None
        if grammar is not None:  # a function call cut short is worth nothing: whole or none
            whole = bool(tools) and req.tool_mode != "none"
            constraint = Grammar.lark(tokenizer, grammar, guard, whole=whole)
        return RenderedPrompt(
            prompt.token_ids, prompt.stop_token_ids, output_reader, constraint=constraint
        )


class HarmonyOutputReader:
    """Harmony segments → builder calls; built-in calls run between generation rounds."""

    def __init__(
        self,
        builder: EventBuilder,
        encoding: HarmonyEncoding,
        token_bytes: HarmonyTokenBytes,
        tools: dict[str, BuiltinTool],
        *,
        include: frozenset[str] = frozenset(),
        max_tool_calls: int,
        skip: frozenset[int] = frozenset(),
    ) -> None:
        self._b = builder
        self._enc = encoding
        self._bytes = token_bytes
        self._tools = tools  # item type -> this response's tool
        self._include = include
        self._max_calls = max_tool_calls
        self._skip = skip
        self._parser = HarmonyStreamParser(encoding)
        self._round_over = False
        self._pending: SegmentEnd | None = None  # a built-in call waiting to run
        self._calls = 0
        self.reasoning_tokens = 0
        self.replay: dict[str, Any] = {}

    # -- the OutputReader protocol ------------------------------------------------------------

    def feed(self, token_id: int, logprob: TokenIdLogprob | None) -> None:
        if token_id in self._skip:
            return  # counted in usage, never shown
        self._handle(self._parser.feed(token_id, logprob))

    @property
    def stop(self) -> bool:
        return False  # <|call|> and <|return|> are stop tokens: the engine stops by itself

    async def follow_up(self) -> list[int] | None:
        self._end_round()
        call, self._pending = self._pending, None
        if call is None:
            return None
        if self._calls >= self._max_calls:
            self._give_up(call)
            return None
        self._calls += 1
        answer = await self._run(call)
        self._parser = HarmonyStreamParser(self._enc)
        self._round_over = False
        return continuation_ids(self._enc, answer)

    def finish(self, cut: bool) -> None:
        self._end_round()
        if self._pending is not None:
            call, self._pending = self._pending, None
            self._give_up(call)

    async def aclose(self) -> None:
        for tool in self._tools.values():
            await tool.aclose()

    # -- segments → events -------------------------------------------------------------------

    def _end_round(self) -> None:
        if not self._round_over:
            self._round_over = True
            self._handle(self._parser.finish())  # a segment still open was cut off
            self.reasoning_tokens += self._parser.reasoning_tokens

    def _handle(self, events: list[Event]) -> None:
        for ev in events:
            if isinstance(ev, SegmentStart):
                self._start(ev)
            elif isinstance(ev, SegmentDelta):
                self._delta(ev)
            elif isinstance(ev, SegmentEnd):
                self._end(ev)
            # Stray tokens count in usage only

    def _start(self, ev: SegmentStart) -> None:
        b = self._b
        if self._pending is not None:  # the model went on without waiting for the tool
            call, self._pending = self._pending, None
            self._give_up(call)
        tool = self._tools.get(ev.kind)
        if ev.kind == "reasoning":
            b.open_reasoning()
        elif ev.kind == "text":
            b.open_message(phase="commentary" if ev.channel == "commentary" else "final_answer")
        elif ev.kind == "function_call":
            b.open_call(ev.name)
        elif tool is not None and tool.streams_input:
            b.open_tool(ev.kind, tool.opening(None))
        # other tools' items open when the call runs (their fields need the whole call)

    def _delta(self, ev: SegmentDelta) -> None:
        b = self._b
        tool = self._tools.get(ev.kind)
        if ev.kind == "reasoning":
            b.reasoning_delta(ev.text)
        elif ev.kind == "text":
            lps = [protocol_logprob(lp, self._bytes) for lp in ev.logprobs or ()]
            b.text_delta(ev.text, lps)
        elif ev.kind == "function_call":
            b.arguments_delta(ev.text)
        elif tool is not None and tool.streams_input:
            b.tool_input_delta(ev.text)

    def _end(self, ev: SegmentEnd) -> None:
        b = self._b
        status: ItemStatus = "incomplete" if ev.cut_off else "completed"
        tool = self._tools.get(ev.kind)
        if ev.kind in ("reasoning", "text"):
            b.end_item(status)
        elif ev.kind == "function_call":
            b.end_call(ev.text, "completed" if ev.valid and not ev.cut_off else "incomplete")
        elif tool is not None:
            if ev.cut_off:
                self._give_up(ev)
                return
            if tool.streams_input:
                b.tool_input_done()
            self._pending = ev

    def _give_up(self, call: SegmentEnd) -> None:
        """A built-in call that will not run: its item ends ``incomplete``."""
        tool = self._tools[call.kind]
        if not tool.streams_input:
            self._b.open_tool(call.kind, tool.opening(ToolCall(call.name, call.text)))
        self._b.end_tool("incomplete")

    # -- built-in tools ----------------------------------------------------------------------

    async def _run(self, segment: SegmentEnd) -> Message:
        """Run a built-in call; its item gets the answer's fields when the request includes
        them, and the later turns' prompts show the model what it saw either way."""
        b = self._b
        tool = self._tools[segment.kind]
        call = ToolCall(segment.name, segment.text)
        if not tool.streams_input:
            b.open_tool(segment.kind, tool.opening(call))
        item = b.current
        b.tool_running()
        answer = await tool.run(call)
        shown = tool.answer_include is None or tool.answer_include in self._include
        b.end_tool("completed" if answer.ok else "failed", answer.item if shown else None)
        if not shown and answer.item:
            self.replay[item.id] = type(item).model_validate({**item.model_dump(), **answer.item})
        channel = segment.channel or "analysis"
        return tool_message(tool.address(call.function), answer.text, channel=channel)
