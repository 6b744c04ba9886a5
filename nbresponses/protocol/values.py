"""Request values checked for their type the way OpenAI's API reports them: a 400 naming the
parameter, with ``integer_out_of_range`` / ``decimal_out_of_range`` for numbers out of their
bounds. The bounds themselves are the request core's (``protocol/generation.py``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, overload

from nbresponses.protocol.errors import bad_request


@overload
def integer(params: Mapping[str, Any], key: str, low: int, high: int | None) -> int | None: ...
@overload
def integer(
    params: Mapping[str, Any], key: str, low: int, high: int | None, default: int
) -> int: ...
def integer(
    params: Mapping[str, Any], key: str, low: int, high: int | None, default: int | None = None
) -> int | None:
    """``params[key]`` as an integer in ``[low, high]`` (``default`` when absent)."""
    value = params.get(key, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise bad_request(f"Invalid type for '{key}': expected an integer.", param=key)
    if value < low or (high is not None and value > high):
        bound = f"between {low} and {high}" if high is not None else f"at least {low}"
        raise bad_request(
            f"Invalid '{key}': {value}; it must be {bound}.", param=key, code="integer_out_of_range"
        )
    return value


def number(params: Mapping[str, Any], key: str, low: float, high: float, default: float) -> float:
    """``params[key]`` as a number in ``[low, high]`` (``default`` when absent)."""
    value = params.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise bad_request(f"Invalid type for '{key}': expected a number.", param=key)
    if not low <= value <= high:
        raise bad_request(
            f"Invalid '{key}': {value}; it must be between {low} and {high}.",
            param=key,
            code="decimal_out_of_range",
        )
    return float(value)


def boolean(params: Mapping[str, Any], key: str, default: bool) -> bool:
    """``params[key]`` as a boolean (``default`` when absent); 1 and "true" are not booleans."""
    value = params.get(key, default)
    if not isinstance(value, bool):
        raise bad_request(f"Invalid type for '{key}': expected a boolean.", param=key)
    return value


def string(params: Mapping[str, Any], key: str) -> str | None:
    """``params[key]`` as a string (None when absent)."""
    value = params.get(key)
    if value is not None and not isinstance(value, str):
        raise bad_request(f"Invalid type for '{key}': expected a string.", param=key)
    return value
