"""Builders of small, typed Responses and their streams for the frames tests.

Responses are built from ``openai.types.responses`` classes; a stream is the event sequence an
OpenAI-compatible server emits for that Response, with ``output_text.delta`` events carrying
the delta-shaped logprobs (no ``bytes``), so the frames' stream path is exercised for real.
"""

from __future__ import annotations

from collections.abc import Sequence

from openai.types.responses import (
    Response,
    ResponseCompletedEvent,
    ResponseContentPartAddedEvent,
    ResponseCreatedEvent,
    ResponseFunctionToolCall,
    ResponseOutputItemAddedEvent,
    ResponseOutputItemDoneEvent,
    ResponseOutputMessage,
    ResponseOutputText,
    ResponseStreamEvent,
    ResponseTextDeltaEvent,
    ResponseTextDoneEvent,
    ResponseUsage,
)
from openai.types.responses import response_text_delta_event as delta_types
from openai.types.responses import response_text_done_event as done_types
from openai.types.responses.response_output_text import Logprob, LogprobTopLogprob
from openai.types.responses.response_usage import InputTokensDetails, OutputTokensDetails

Alternative = tuple[str, float]


def token_text(raw: bytes) -> str:
    """How an API spells a token: its text, or ``bytes:\\xNN`` when it splits a character."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return "bytes:" + "".join(f"\\x{b:02x}" for b in raw)


def logprob(token: str | bytes, value: float, top: Sequence[Alternative] = ()) -> Logprob:
    raw = token if isinstance(token, bytes) else token.encode()
    return Logprob(
        token=token_text(raw),
        bytes=list(raw),
        logprob=value,
        top_logprobs=[
            LogprobTopLogprob(token=t, bytes=list(t.encode()), logprob=lp) for t, lp in top
        ],
    )


def message(
    parts: Sequence[Sequence[Logprob] | None], item_id: str = "msg_1"
) -> ResponseOutputMessage:
    """A message with one output_text per entry (None: a part without logprobs)."""
    content = []
    for entries in parts:
        text = b"".join(bytes(e.bytes) for e in entries or ()).decode("utf-8", errors="replace")
        content.append(
            ResponseOutputText(
                type="output_text",
                text=text,
                annotations=[],
                logprobs=None if entries is None else list(entries),
            )
        )
    return ResponseOutputMessage(
        type="message", id=item_id, role="assistant", status="completed", content=content
    )


def usage(inp: int = 10, out: int = 5, cached: int = 2, reasoning: int = 1) -> ResponseUsage:
    return ResponseUsage(
        input_tokens=inp,
        input_tokens_details=InputTokensDetails(cached_tokens=cached, cache_write_tokens=0),
        output_tokens=out,
        output_tokens_details=OutputTokensDetails(reasoning_tokens=reasoning),
        total_tokens=inp + out,
    )


def response(
    *items: ResponseOutputMessage | ResponseFunctionToolCall,
    rid: str = "resp_1",
    status: str = "completed",
    with_usage: bool = True,
) -> Response:
    return Response(
        id=rid,
        object="response",
        created_at=1_700_000_000,
        model="test-model",
        status=status,
        output=list(items),
        parallel_tool_calls=True,
        tool_choice="auto",
        tools=[],
        usage=usage() if with_usage else None,
    )


def tool_call(call_id: str = "call_1") -> ResponseFunctionToolCall:
    return ResponseFunctionToolCall(
        type="function_call", id=f"fc_{call_id}", call_id=call_id, name="f", arguments="{}"
    )


def _delta_logprob(entry: Logprob) -> delta_types.Logprob:
    tops = [
        delta_types.LogprobTopLogprob(token=t.token, logprob=t.logprob) for t in entry.top_logprobs
    ]
    return delta_types.Logprob(token=entry.token, logprob=entry.logprob, top_logprobs=tops)


def _done_logprob(entry: Logprob) -> done_types.Logprob:
    tops = [
        done_types.LogprobTopLogprob(token=t.token, logprob=t.logprob) for t in entry.top_logprobs
    ]
    return done_types.Logprob(token=entry.token, logprob=entry.logprob, top_logprobs=tops)


def stream(
    final: Response,
    *,
    per_delta: int = 1,
    done: bool = True,
    completed: bool = True,
) -> list[ResponseStreamEvent]:
    """The events of ``final`` streamed ``per_delta`` tokens at a time."""
    seq = iter(range(10**9))
    empty = final.model_copy(update={"output": [], "status": "in_progress", "usage": None})
    events: list[ResponseStreamEvent] = [
        ResponseCreatedEvent(type="response.created", response=empty, sequence_number=next(seq))
    ]
    for oi, item in enumerate(final.output):
        shell = item.model_copy(update={"content": []}) if item.type == "message" else item
        events.append(
            ResponseOutputItemAddedEvent(
                type="response.output_item.added", item=shell, output_index=oi,
                sequence_number=next(seq),
            )
        )  # fmt: skip
        for ci, part in enumerate(item.content if item.type == "message" else ()):
            events.append(
                ResponseContentPartAddedEvent(
                    type="response.content_part.added", item_id=item.id, output_index=oi,
                    content_index=ci, sequence_number=next(seq),
                    part=part.model_copy(update={"text": "", "logprobs": []}),
                )
            )  # fmt: skip
            entries = part.logprobs or []
            decoder_text = ""
            for start in range(0, len(entries), per_delta):
                chunk = entries[start : start + per_delta]
                raw = b"".join(bytes(e.bytes) for e in entries[: start + per_delta])
                text = raw.decode("utf-8", errors="ignore")
                events.append(
                    ResponseTextDeltaEvent(
                        type="response.output_text.delta", item_id=item.id, output_index=oi,
                        content_index=ci, delta=text[len(decoder_text):],
                        logprobs=[_delta_logprob(e) for e in chunk], sequence_number=next(seq),
                    )
                )  # fmt: skip
                decoder_text = text
            if done:
                events.append(
                    ResponseTextDoneEvent(
                        type="response.output_text.done", item_id=item.id, output_index=oi,
                        content_index=ci, text=part.text,
                        logprobs=[_done_logprob(e) for e in entries], sequence_number=next(seq),
                    )
                )  # fmt: skip
        events.append(
            ResponseOutputItemDoneEvent(
                type="response.output_item.done", item=item, output_index=oi,
                sequence_number=next(seq),
            )
        )  # fmt: skip
    if completed:
        events.append(
            ResponseCompletedEvent(
                type="response.completed", response=final, sequence_number=next(seq)
            )
        )
    return events
