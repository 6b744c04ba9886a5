"""The Responses API over a token source: ``AsyncResponsesClient(source, tokenizer, model=...)``."""

from nbresponses.responses.client import AsyncResponsesClient
from nbresponses.responses.stream import ResponseEventStream
from nbresponses.responses.tools import FunctionToolSpec, function_tool

__all__ = ["AsyncResponsesClient", "FunctionToolSpec", "ResponseEventStream", "function_tool"]
