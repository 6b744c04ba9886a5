"""Usage in OpenAI's shape from the engine's counts and the parser's reasoning count."""

from __future__ import annotations

from openai.types.responses import ResponseUsage
from openai.types.responses.response_usage import InputTokensDetails, OutputTokensDetails

from nbresponses.tokens.contract import GenerationStats


def build_usage(
    stats: GenerationStats, *, prompt_tokens: int, output_tokens: int, reasoning_tokens: int
) -> ResponseUsage:
    """Input (with cached prefix), output (with reasoning) and total tokens.

    Output tokens are counted from the steps actually received (exact even when the engine
    stops early); input falls back to the rendered prompt length if the engine did not say.
    """
    input_tokens = stats.prompt_tokens or prompt_tokens
    return ResponseUsage(
        input_tokens=input_tokens,
        input_tokens_details=InputTokensDetails(
            cached_tokens=min(stats.cached_tokens, input_tokens), cache_write_tokens=0
        ),
        output_tokens=output_tokens,
        output_tokens_details=OutputTokensDetails(reasoning_tokens=reasoning_tokens),
        total_tokens=input_tokens + output_tokens,
    )
