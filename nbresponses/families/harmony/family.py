"""gpt-oss models: harmony rendering, harmony segments → events, built-in tool rounds.

Segments map to output items: ``analysis`` → reasoning (``reasoning_text``); ``final`` and
``commentary`` text → messages with ``phase`` "final_answer" / "commentary"; a message to
``functions.NAME`` → a ``function_call`` (the response ends; the caller answers with
``function_call_output``); to ``python`` → a ``code_interpreter_call``; to ``browser.*`` → a
``web_search_call``. Built-in calls run within the response: the tool's answer is appended to
prompt + output and the model goes on, at most ``max_tool_calls`` times (a call beyond that is
left ``incomplete`` and the response ends). Tokens outside any message count in usage only.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from openai.types.responses import ResponseCodeInterpreterToolCall
from openai_harmony import HarmonyEncoding, Message

from nbresponses.families.base import RenderedPrompt
from nbresponses.families.harmony import (
    Event,
    HarmonyStreamParser,
    SegmentDelta,
    SegmentEnd,
    SegmentStart,
    continuation_ids,
    harmony_encoding,
    python_tool_description,
    render_request,
    tool_result_message,
)
from nbresponses.families.harmony.token_bytes import HarmonyTokenBytes
from nbresponses.families.text import protocol_logprob
from nbresponses.protocol.errors import bad_request, unsupported
from nbresponses.protocol.events import EventBuilder
from nbresponses.protocol.ids import new_id
from nbresponses.protocol.request import OUTPUTS_INCLUDE, WEB_SEARCH, CreateRequest
from nbresponses.tokens.contract import TokenIdLogprob
from nbresponses.tools.session import BuiltinTools

# A browser call whose arguments did not parse still needs an action on its item.
FALLBACK_ACTIONS = {
    "search": {"type": "search"},
    "open": {"type": "open_page"},
    "find": {"type": "find_in_page", "pattern": "", "url": ""},
}


class HarmonyFamily:
    """The format of gpt-oss models (``model_type == "gpt_oss"``)."""

    name = "harmony"

    def __init__(
        self,
        encoding: HarmonyEncoding | None = None,
        *,
        browser: Any = None,
        python_timeout: float = 120.0,
        max_tool_calls: int = 16,
        eos_token_ids: Iterable[int] = (),
    ) -> None:
        self.encoding = encoding if encoding is not None else harmony_encoding()
        self.browser = browser
        self.python_timeout = python_timeout
        self.max_tool_calls = max_tool_calls
        self._bytes = HarmonyTokenBytes(self.encoding)
        self._stops = tuple(self.encoding.stop_tokens_for_assistant_actions())
        # end-of-text ids the engine may stop on that harmony's grammar does not read
        self._skip = frozenset(eos_token_ids) - set(self._stops)

    def check(self, req: CreateRequest, history: Sequence[Any]) -> None:
        if req.tool_mode == "required":
            raise unsupported(
                "tool_choice", "gpt-oss models choose their tools themselves: use 'auto' or 'none'."
            )
        for i, tool in enumerate(req.all_tools):
            if tool.type in WEB_SEARCH and self.browser is None:
                raise bad_request(
                    f"'tools[{i}]': web_search needs a browser backend, and this client has "
                    "none: family=HarmonyFamily(browser=MyBackend()).",
                    param=f"tools[{i}]",
                )

    def render(self, req: CreateRequest, history: Sequence[Any]) -> RenderedPrompt:
        tools_on = req.tool_mode != "none"
        builtin = {t.type: t for t in req.builtin_tools} if tools_on else {}
        code: Any = builtin.get("code_interpreter")
        browse = any(kind in WEB_SEARCH for kind in builtin)
        try:
            prompt = render_request(
                self.encoding,
                list(history),
                instructions=req.instructions,
                tools=[t.model_dump(exclude_none=True) for t in req.tools] if tools_on else [],
                reasoning=req.reasoning,
                python=code is not None,
                browser=browse,
                python_description=python_tool_description(self.python_timeout),
            )
        except ValueError as exc:
            raise bad_request(
                f"Cannot render this conversation for gpt-oss: {exc}", param="input"
            ) from None
        container = getattr(code, "container", None)
        limit = min(self.max_tool_calls, req.max_tool_calls or self.max_tool_calls)

        def decoder(builder: EventBuilder) -> HarmonyDecoder:
            tools = BuiltinTools(
                python=code is not None,
                python_timeout=self.python_timeout,
                memory_limit=getattr(container, "memory_limit", None),
                browser=self.browser if browse else None,
            )
            return HarmonyDecoder(
                builder,
                self.encoding,
                self._bytes,
                tools,
                include_outputs=OUTPUTS_INCLUDE in req.include,
                max_tool_calls=limit,
                skip=self._skip,
            )

        return RenderedPrompt(prompt.token_ids, prompt.stop_token_ids, decoder)


class HarmonyDecoder:
    """Harmony segments → builder calls; built-in calls run between generation rounds."""

    def __init__(
        self,
        builder: EventBuilder,
        encoding: HarmonyEncoding,
        token_bytes: HarmonyTokenBytes,
        tools: BuiltinTools,
        *,
        include_outputs: bool,
        max_tool_calls: int,
        skip: frozenset[int] = frozenset(),
    ) -> None:
        self._b = builder
        self._enc = encoding
        self._bytes = token_bytes
        self._tools = tools
        self._include = include_outputs
        self._max_calls = max_tool_calls
        self._skip = skip
        self._parser = HarmonyStreamParser(encoding)
        self._round_over = False
        self._pending: SegmentEnd | None = None  # a built-in call waiting to run
        self._calls = 0
        self._container = new_id("cntr")  # one sandbox per response
        self.reasoning_tokens = 0
        self.replay: dict[str, Any] = {}

    # -- the Decoder protocol ----------------------------------------------------------------

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
        if call.kind == "code_interpreter_call":
            answer = await self._run_python(call)
        else:
            answer = await self._run_browser(call)
        self._parser = HarmonyStreamParser(self._enc)
        self._round_over = False
        return continuation_ids(self._enc, answer)

    def finish(self, cut: bool) -> None:
        self._end_round()
        if self._pending is not None:
            call, self._pending = self._pending, None
            self._give_up(call)

    async def aclose(self) -> None:
        await self._tools.aclose()

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
        if ev.kind == "reasoning":
            b.open_reasoning()
        elif ev.kind == "text":
            b.open_message(phase="commentary" if ev.channel == "commentary" else "final_answer")
        elif ev.kind == "function_call":
            b.open_call(ev.name)
        elif ev.kind == "code_interpreter_call":
            b.open_code(self._container)
        # web_search_call: its item opens when the call runs (its action needs the arguments)

    def _delta(self, ev: SegmentDelta) -> None:
        b = self._b
        if ev.kind == "reasoning":
            b.reasoning_delta(ev.text)
        elif ev.kind == "text":
            lps = [protocol_logprob(lp, self._bytes) for lp in ev.logprobs or ()]
            b.text_delta(ev.text, lps)
        elif ev.kind == "function_call":
            b.arguments_delta(ev.text)
        elif ev.kind == "code_interpreter_call":
            b.code_delta(ev.text)

    def _end(self, ev: SegmentEnd) -> None:
        b = self._b
        status = "incomplete" if ev.cut_off else "completed"
        if ev.kind in ("reasoning", "text"):
            b.close(status)
        elif ev.kind == "function_call":
            b.close_call(ev.text, "completed" if ev.valid and not ev.cut_off else "incomplete")
        elif ev.cut_off:
            self._give_up(ev)
        else:
            if ev.kind == "code_interpreter_call":
                b.code_done()
            self._pending = ev

    def _give_up(self, call: SegmentEnd) -> None:
        """A built-in call that will not run: its item ends ``incomplete``."""
        if call.kind == "code_interpreter_call":
            self._b.close_code("incomplete")
        else:
            self._b.open_web_search(call.action or FALLBACK_ACTIONS[call.name])
            self._b.close_web_search(None, "incomplete")

    # -- built-in tools ----------------------------------------------------------------------

    async def _run_python(self, call: SegmentEnd) -> Message:
        b = self._b
        item = b.current
        b.code_interpreting()
        result = await self._tools.python(call.code)
        outputs = [{"type": "logs", "logs": result.text}] if result.text else []
        b.close_code("completed" if result.ok else "failed", outputs if self._include else None)
        if not self._include:  # the next turn's prompt still shows the model what it saw
            self.replay[item.id] = ResponseCodeInterpreterToolCall.model_validate(
                {**item.model_dump(), "outputs": outputs}
            )
        return tool_result_message("python", result.text, channel=call.channel or "analysis")

    async def _run_browser(self, call: SegmentEnd) -> Message:
        b = self._b
        b.open_web_search(call.action or FALLBACK_ACTIONS[call.name])
        b.web_searching()
        result = await self._tools.browse(call.name, call.arguments)
        b.close_web_search(result.action, "completed" if result.ok else "failed")
        channel = call.channel or "analysis"
        return tool_result_message(f"browser.{call.name}", result.text, channel=channel)
