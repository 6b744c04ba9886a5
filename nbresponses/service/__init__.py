"""The Responses API over a token source: ``AsyncResponsesClient(source, tokenizer, model=...)``."""

from nbresponses.service.client import AsyncResponsesClient
from nbresponses.service.function_tools import FunctionToolSpec, function_tool
from nbresponses.service.stream import ResponseEventStream

__all__ = ["AsyncResponsesClient", "FunctionToolSpec", "ResponseEventStream", "function_tool"]
