"""Chat-template models: render with the tokenizer's template, read ``<think>`` and Hermes calls.

Generated ids are detokenized incrementally and parsed as text (``parser.py``); each parser
event carries the text position it accounts for, which is how each token (and its logprob) is
attributed to the segment where it begins. Built-in tools and their items need a gpt-oss model
and are refused here with a 400.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import Any

from openai.types.responses import FunctionTool

from nbresponses.families.base import RenderedPrompt
from nbresponses.families.chat.grammar import chat_grammar, guard_after
from nbresponses.families.chat.messages import to_chat
from nbresponses.families.chat.parser import (
    THINK_CLOSE,
    THINK_OPEN,
    Delta,
    End,
    Event,
    Start,
    StreamParser,
)
from nbresponses.families.chat.reasoning import effort_kwargs
from nbresponses.families.chat.template import TemplateCapabilities, render, tool_schema
from nbresponses.families.constrain import output_schema, tool_schemas
from nbresponses.families.text import IncrementalDetokenizer, TokenBytes, protocol_logprob
from nbresponses.grammar import Grammar, GrammarTokenizer, Guard
from nbresponses.protocol.errors import bad_request, unsupported
from nbresponses.protocol.events import EventBuilder, TokenLogprob
from nbresponses.protocol.items import BUILTIN_ITEMS
from nbresponses.protocol.request import CreateRequest
from nbresponses.tokens.contract import TokenIdLogprob, Tokenizer

HARMONY_ONLY = "needs a gpt-oss (harmony) model; this model uses a chat template"


class ChatFamily:
    """The format of models with a Hugging Face chat template."""

    name = "chat"

    def __init__(self, tokenizer: Tokenizer, *, eos_token_ids: Sequence[int]) -> None:
        self.tokenizer = tokenizer
        self.caps = TemplateCapabilities.of(tokenizer)
        self._bytes = TokenBytes(tokenizer)
        self._eos = tuple(eos_token_ids)
        self._grammar_tokenizer: GrammarTokenizer | None = None
        self._keep_special = _special_think_tags(tokenizer)

    def grammar_tokenizer(self) -> GrammarTokenizer:
        """The tokenizer as the grammar engine sees it (built on first use: ~0.5 s)."""
        if self._grammar_tokenizer is None:
            tok = self.tokenizer
            size = max(tok.get_vocab().values()) + 1
            special = set(getattr(tok, "all_special_ids", ()))
            added = getattr(tok, "added_tokens_decoder", {})
            special |= {i for i, t in added.items() if getattr(t, "special", False)}
            self._grammar_tokenizer = GrammarTokenizer.from_bytes(
                [bytes(self._bytes.get(i)[1]) for i in range(size)],
                encode=self.encode,
                eos_token_id=self._eos[0] if self._eos else int(tok.eos_token_id or 0),
                special_token_ids=sorted(special),
            )
        return self._grammar_tokenizer

    def check(self, req: CreateRequest, conversation: Sequence[Any]) -> None:
        for i, tool in enumerate(req.all_tools):
            if not isinstance(tool, FunctionTool):
                raise unsupported(f"tools[{i}]", f"tool type {tool.type!r} {HARMONY_ONLY}.")
        for i, item in enumerate(req.input):
            if item.type in BUILTIN_ITEMS:
                raise bad_request(
                    f"A {item.type} item at 'input[{i}]' {HARMONY_ONLY}.", param=f"input[{i}]"
                )
        if req.max_tool_calls is not None:
            raise unsupported(
                "max_tool_calls", f"it counts built-in tool calls, which {HARMONY_ONLY}."
            )
        if req.reasoning is not None:
            effort_kwargs(self.caps, req.reasoning.effort)  # a 400 where it cannot be honoured
        output_schema(req)  # a 400 for a schema (or tool schema) that cannot be enforced
        if req.tool_mode != "none":
            tool_schemas(req)

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def decode(self, token_ids: Sequence[int]) -> str:
        return self.tokenizer.decode(
            list(token_ids), skip_special_tokens=False, clean_up_tokenization_spaces=False
        )

    def token_logprob(self, logprob: TokenIdLogprob) -> TokenLogprob:
        return protocol_logprob(logprob, self._bytes)

    def render(self, req: CreateRequest, conversation: Sequence[Any]) -> RenderedPrompt:
        tools = [tool_schema(t.name, t.description, t.parameters) for t in req.tools]
        prompt = render(
            self.tokenizer,
            to_chat(conversation, req.instructions),
            tools=tools,
            tool_mode=req.tool_mode,  # type: ignore[arg-type]
            forced_tool=req.forced_tool,
            reasoning_effort=req.reasoning.effort if req.reasoning else None,
        )
        calls = bool(tools) and req.tool_mode != "none"
        forced = calls and req.tool_mode == "required"
        grammar = chat_grammar(
            answer=output_schema(req),
            tools=tool_schemas(req) if calls else [],
            mode=req.tool_mode,
            forced_tool=req.forced_tool,
            parallel=req.parallel_tool_calls,
            prefill=prompt.lead,
            may_think=prompt.start == "free" and self.caps.reasons,
        )
        guard = Guard(
            req.repetition_guard,
            guard_after(
                answer=req.text_format is not None,
                calls=calls,
                mode=req.tool_mode,
                prefill=prompt.lead,
            ),
        )
        constraint = None
        if grammar:  # a function call cut short is worth nothing: whole or none (``whole``)
            constraint = Grammar.lark(self.grammar_tokenizer(), grammar, guard, whole=calls)

        def output_reader(builder: EventBuilder) -> ChatOutputReader:
            return ChatOutputReader(
                builder,
                self.tokenizer,
                self._bytes,
                self._eos,
                tools=calls,
                prefill=prompt.lead,
                parallel_tool_calls=req.parallel_tool_calls and not forced,
                keep_special=self._keep_special,
            )

        return RenderedPrompt(
            ids=prompt.ids,
            stop_token_ids=self._eos,
            output_reader=output_reader,
            constraint=constraint,
        )


class ChatOutputReader:
    """Detokenizer + text parser → builder calls, with exact token attribution."""

    def __init__(
        self,
        builder: EventBuilder,
        tokenizer: Tokenizer,
        token_bytes: TokenBytes,
        eos: Sequence[int],
        *,
        tools: bool,
        prefill: str,
        parallel_tool_calls: bool,
        keep_special: bool = False,
    ) -> None:
        self._b = builder
        self._bytes = token_bytes
        self._eos = set(eos)
        self._detok = IncrementalDetokenizer(tokenizer, skip_special_tokens=not keep_special)
        self._parser = StreamParser(tools=tools, prefill=prefill)
        self._parallel = parallel_tool_calls
        self._pending: deque[tuple[int, TokenLogprob | None]] = deque()  # (text start, logprob)
        self._carry: list[TokenLogprob] = []  # text logprobs waiting for the next text delta
        self._calls = 0
        self._cut = False
        self.reasoning_tokens = 0
        self.replay: dict[str, Any] = {}

    def feed(self, token_id: int, logprob: TokenIdLogprob | None) -> None:
        if token_id in self._eos:
            return  # counted in usage, never shown
        lp = protocol_logprob(logprob, self._bytes) if logprob is not None else None
        self._pending.append((len(self._detok.text), lp))
        text = self._detok.push(token_id)
        if text:
            self._handle(self._parser.feed(text))

    @property
    def stop(self) -> bool:
        return bool(self._calls) and not self._parallel

    async def follow_up(self) -> list[int] | None:
        return None  # function calls end the response; the caller answers them

    def finish(self, cut: bool) -> None:
        tail = self._detok.flush()
        events = self._parser.feed(tail) if tail else []
        events += self._parser.finish()
        self._cut = cut  # what is still open was cut off
        self._handle(events)
        self._take(1 << 62)

    async def aclose(self) -> None:
        return None

    def _take(self, end: int) -> list[TokenLogprob | None]:
        taken = []
        while self._pending and self._pending[0][0] < end:
            taken.append(self._pending.popleft()[1])
        return taken

    def _handle(self, events: list[Event]) -> None:
        b = self._b
        for ev in events:
            taken = self._take(ev.end)
            if ev.kind == "reasoning":
                self.reasoning_tokens += len(taken)
            elif ev.kind == "text" and isinstance(ev, Delta):
                # tokens before a text Start were trimmed whitespace: not part of the text
                self._carry.extend(lp for lp in taken if lp is not None)
            if isinstance(ev, Start):
                if ev.kind == "text":
                    b.open_message()
                elif ev.kind == "reasoning":
                    b.open_reasoning()
                else:
                    b.open_call(ev.name)
            elif isinstance(ev, Delta):
                if ev.kind == "text":
                    b.text_delta(ev.text, self._carry[:])
                    self._carry.clear()
                elif ev.kind == "reasoning":
                    b.reasoning_delta(ev.text)
                else:
                    b.arguments_delta(ev.text)
            elif isinstance(ev, End):
                if ev.kind == "tool_call":
                    b.end_call(ev.arguments, "completed" if ev.valid else "incomplete")
                    self._calls += 1
                else:
                    b.end_item("incomplete" if self._cut else "completed")
                self._carry.clear()


def _special_think_tags(tokenizer: Tokenizer) -> bool:
    """Whether ``<think>`` or ``</think>`` is a special token of this tokenizer: a detokenizer
    that skips special tokens would drop the tag and show the reasoning as the answer."""
    try:
        vocab = tokenizer.get_vocab()
    except Exception:
        return False
    special = set(getattr(tokenizer, "all_special_ids", ()))
    added = getattr(tokenizer, "added_tokens_decoder", {})
    special |= {i for i, t in added.items() if getattr(t, "special", False)}
    return any(vocab.get(tag) in special for tag in (THINK_OPEN, THINK_CLOSE))
