"""Turn events and SDK models into plain JSON data.

The view keeps its state as plain dicts so that folding is cheap and the state can be sent to
the front end as it is; SDK objects (ours or openai's) and dicts are both accepted as input.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel


def plain(value: Any) -> Any:
    """A JSON-ready deep copy of ``value`` (models are dumped, dicts and lists copied)."""
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, BaseModel):
        return plain(value.model_dump(mode="json", exclude_unset=True, warnings=False))
    if value is None or isinstance(value, (str, int, bool)):
        return value
    if isinstance(value, float):
        return value if value == value and value not in (float("inf"), float("-inf")) else None
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)


def fields(event: Any) -> dict[str, Any]:
    """The top-level fields of an event without copying nested values (the hot path)."""
    if isinstance(event, dict):
        return event
    if isinstance(event, BaseModel):
        extra = event.__pydantic_extra__
        return {**event.__dict__, **extra} if extra else event.__dict__
    raise TypeError(f"not an event: {type(event).__name__}")


def clone(value: Any) -> Any:
    """A deep copy of data that is already plain JSON (faster than :func:`plain`)."""
    kind = type(value)
    if kind is dict:
        return {k: clone(v) for k, v in value.items()}
    if kind is list:
        return [clone(v) for v in value]
    return value
