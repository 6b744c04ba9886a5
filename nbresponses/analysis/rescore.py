"""Score exactly what was generated: a Response's own tokens, not a re-encoding of its text.

A generated answer's tokens are not always the canonical encoding of its text (a 40-token
answer can re-encode to 41 tokens), so ``score(prompt, r.output_text)`` may score other tokens
than those generated and its rows no longer line up. Here the tokens come from the Response's
logprob entries (their bytes, mapped back to ids with this engine's vocabulary) and the prompt
is rebuilt from the conversation it answered (this engine's store, or ``input=`` given), so
the scoring has one row per generated token (``LocalBackend.own_tokens``; ``Analyses.score``
scores them). On the engine that generated it the logprobs are the ones it streamed, bit for
bit (with ``method="decode"`` on every recipe; with the default, prefill, on the fused ones).
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from typing import Any

from openai.types.responses import Response

from nbresponses.families.base import Family
from nbresponses.protocol.request import parse_create
from nbresponses.service.store import ResponseStore
from nbresponses.tokens.contract import TokenIdLogprob

__all__ = ["generated_ids", "prompt_ids"]

_VOCABS: weakref.WeakKeyDictionary[Any, dict[int, dict[bytes, list[int]]]] = (
    weakref.WeakKeyDictionary()
)


def _ids_by_bytes(family: Family, vocab_size: int) -> dict[bytes, list[int]]:
    """Token bytes -> ids, over the vocabulary (cached per family)."""
    cached = _VOCABS.setdefault(family, {})
    if vocab_size not in cached:
        table: dict[bytes, list[int]] = {}
        for token_id in range(vocab_size):
            try:
                raw = bytes(family.token_logprob(TokenIdLogprob(token_id, 0.0)).bytes)
            except (IndexError, KeyError, ValueError, TypeError):  # ids past the tokenizer's
                continue
            table.setdefault(raw, []).append(token_id)
        cached[vocab_size] = table
    return cached[vocab_size]


def _entries(response: Response) -> list[Any]:
    """The logprob entries of the response's one output text, which must hold every token."""
    parts = [
        part
        for item in response.output
        for part in (getattr(item, "content", None) or [])
        if getattr(part, "type", None) == "output_text"
    ]
    others = [item.type for item in response.output if item.type != "message"]
    if others or len(parts) != 1:
        raise ValueError(
            "scoring a response's own tokens needs a response whose output is one text "
            f"(this one has {len(parts)} output texts and {others or 'no'} other items, whose "
            "tokens carry no logprobs)"
        )
    entries = parts[0].logprobs
    if not entries:
        raise ValueError(
            "the response carries no token logprobs: create it with "
            'include=["message.output_text.logprobs"] to score its own tokens'
        )
    return list(entries)


def generated_ids(family: Family, vocab_size: int, response: Response) -> list[int]:
    """The token ids of the response's output text, from its logprob entries' bytes."""
    table = _ids_by_bytes(family, vocab_size)
    ids = []
    for position, entry in enumerate(_entries(response)):
        raw = bytes(entry.bytes) if entry.bytes is not None else entry.token.encode("utf-8")
        candidates = table.get(raw, [])
        if len(candidates) > 1:  # the display string may tell them apart
            named = [i for i in candidates if family.token_logprob(TokenIdLogprob(i, 0.0)).token
                     == entry.token]  # fmt: skip
            candidates = named
        if len(candidates) != 1:
            raise ValueError(
                f"token {position} ({entry.token!r}) is {'not' if not candidates else 'ambiguous'}"
                " in this model's vocabulary: was the response made with the same tokenizer?"
            )
        ids.append(candidates[0])
    return ids


def _request_of(response: Response, history: Sequence[Any], model: str) -> Any:
    """A create request with the response's own settings (instructions, tools, format)."""
    fields: dict[str, Any] = {"input": list(history)}
    if response.instructions:
        fields["instructions"] = response.instructions
    if response.tools:
        fields["tools"] = [t.model_dump(exclude_none=True) for t in response.tools]
    for name in ("tool_choice", "reasoning", "text"):
        value = getattr(response, name, None)
        if value is not None:
            fields[name] = value if isinstance(value, str) else value.model_dump(exclude_none=True)
    fields["parallel_tool_calls"] = response.parallel_tool_calls
    return parse_create(fields, model=model)


def prompt_ids(
    family: Family,
    store: ResponseStore | None,
    response: Response,
    *,
    input: Any = None,
    model: str,
) -> list[int]:
    """The prompt the response was generated from: rendered from ``input`` when given, else
    from the conversation stored with it; checked against the response's input token count."""
    if input is None:
        record = store.parent(response.id) if store is not None else None
        if record is None:
            raise ValueError(
                f"response {response.id!r} is not in this engine's store: pass the input it "
                "answered, engine.score(response, input=...)"
            )
        history = [*record.context, *record.input]
    else:
        history = [{"role": "user", "content": input}] if isinstance(input, str) else list(input)
    req = _request_of(response, history, model)
    ids = list(family.render(req, req.input).ids)
    expected = response.usage.input_tokens if response.usage is not None else None
    if expected is not None and expected != len(ids):
        raise ValueError(
            f"the rebuilt prompt has {len(ids)} tokens, the response was generated from "
            f"{expected}: give the exact input it answered (engine.score(response, input=...))"
        )
    return ids
