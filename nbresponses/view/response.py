"""Build an ``openai.types.responses.Response`` from the folded state.

The SDK's recursive ``construct`` tolerates the shapes real traffic has (missing "required"
fields, extra fields, newer item types), but it costs ~180 µs per nested object: a
1,000-token answer with top-5 logprobs holds 6,000 of them (over a second). Logprobs have a
flat, known shape, so they are built directly with pydantic's non-validating constructor.
"""

from __future__ import annotations

from typing import Any

from openai.types.responses import Response
from openai.types.responses.response_output_text import Logprob, LogprobTopLogprob
from pydantic import BaseModel

_construct = BaseModel.model_construct.__func__  # type: ignore[attr-defined]


def _logprob(data: Any) -> Any:
    if not isinstance(data, dict):
        return data
    top = data.get("top_logprobs")
    fields = dict(data)
    if isinstance(top, list):
        fields["top_logprobs"] = [
            _construct(LogprobTopLogprob, **t) if isinstance(t, dict) else t for t in top
        ]
    return _construct(Logprob, **fields)


def to_response(data: dict[str, Any]) -> Response:
    """A Response from the folded dict (``None`` placeholders for missing items dropped)."""
    output: list[Any] = []
    logprobs: dict[tuple[int, int], list[Any]] = {}
    for item in data.get("output") or []:
        if item is None:
            continue
        if isinstance(item, dict) and isinstance(item.get("content"), list):
            content = []
            for j, part in enumerate(item["content"]):
                if isinstance(part, dict) and isinstance(part.get("logprobs"), list):
                    logprobs[(len(output), j)] = part["logprobs"]
                    part = {k: v for k, v in part.items() if k != "logprobs"}
                content.append(part)
            item = {**item, "content": content}
        output.append(item)
    response = Response.construct(**{**data, "output": output})
    for (i, j), values in logprobs.items():
        part = getattr(response.output[i], "content")[j]  # noqa: B009 (a message, by construction)
        object.__setattr__(part, "logprobs", [_logprob(lp) for lp in values])
        fields_set = getattr(part, "__pydantic_fields_set__", None)
        if isinstance(fields_set, set):
            fields_set.add("logprobs")
    return response
