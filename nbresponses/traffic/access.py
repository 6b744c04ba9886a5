"""Read fields the same way from pydantic ``openai.types`` objects and from JSON dicts.

Frames accept both shapes (and mixtures), and recorded traffic carries fields a given SDK may
not know, so nothing here validates: a missing field reads as ``default``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from operator import attrgetter, itemgetter
from typing import Any, Literal

__all__ = ["Kind", "field", "getter", "kind_of"]

Kind = Literal["response", "event", "unknown"]


def field(obj: Any, name: str, default: Any = None) -> Any:
    """``obj[name]`` for a mapping, ``obj.name`` otherwise; ``default`` when absent or None."""
    value = obj.get(name, default) if isinstance(obj, Mapping) else getattr(obj, name, default)
    return default if value is None else value


def getter(sample: Any, *names: str) -> Callable[[Any], Any]:
    """A C-speed accessor for ``names`` on objects shaped like ``sample`` (per-token loops).

    Raises KeyError/AttributeError on entries that lack a name; callers then fall back to
    :func:`field`.
    """
    return itemgetter(*names) if isinstance(sample, Mapping) else attrgetter(*names)


def kind_of(obj: Any) -> Kind:
    """Whether ``obj`` is a Response, a stream event, or something frames skip."""
    if field(obj, "object") == "response":
        return "response"
    kind = field(obj, "type")
    if isinstance(kind, str) and (kind.startswith("response.") or kind == "error"):
        return "event"
    return "unknown"
