"""A live anywidget view of OpenAI Responses streams: ``show(source)`` and ``ResponseView``."""

from .widget import ResponseView, show

__all__ = ["ResponseView", "show"]
