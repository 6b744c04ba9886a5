"""Usage in OpenAI's shape from token counts: input (with its cached prefix), output (with
reasoning) and total."""

from __future__ import annotations

from openai.types.responses import ResponseUsage
from openai.types.responses.response_usage import InputTokensDetails, OutputTokensDetails


def build_usage(
    *, input_tokens: int, cached_tokens: int, output_tokens: int, reasoning_tokens: int
) -> ResponseUsage:
    return ResponseUsage(
        input_tokens=input_tokens,
        input_tokens_details=InputTokensDetails(
            cached_tokens=min(cached_tokens, input_tokens), cache_write_tokens=0
        ),
        output_tokens=output_tokens,
        output_tokens_details=OutputTokensDetails(reasoning_tokens=reasoning_tokens),
        total_tokens=input_tokens + output_tokens,
    )
