"""The Responses API over a token source: ``AsyncResponsesClient(source, tokenizer, model=...)``.

Names are imported lazily: ``nbresponses.service.history`` (the stored responses as a
DataFrame) must not pull in the model families and their tokenizers.
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {
    "AsyncResponsesClient": "nbresponses.service.client",
    "FunctionToolSpec": "nbresponses.service.function_tools",
    "function_tool": "nbresponses.service.function_tools",
    "ResponseEventStream": "nbresponses.service.stream",
}

__all__ = list(_LAZY)


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'nbresponses.service' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
