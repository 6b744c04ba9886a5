"""Status and usage wording shared by the text and HTML representations.

The front end computes the same figures in JavaScript from the same state; keeping the
Python wording in one place keeps the static HTML and ``repr`` consistent with each other.
"""

from __future__ import annotations

from typing import Any


def status_label(state: dict[str, Any]) -> str:
    """One word or phrase for where the response stands (the view's own notion included)."""
    response, view = state["response"], state["view"]
    status = response.get("status")
    if view.get("cancelled"):
        return "cancelled"
    if view.get("exception"):
        return "error"
    if view.get("phase") == "done" and view.get("interrupted"):
        return "interrupted"
    if status == "incomplete":
        reason = (response.get("incomplete_details") or {}).get("reason")
        return f"incomplete ({reason})" if reason else "incomplete"
    if status == "failed":
        message = (response.get("error") or {}).get("message")
        return f"failed: {message}" if message else "failed"
    if status:
        return str(status).replace("_", " ")  # "in progress", not the wire's "in_progress"
    return "waiting" if view.get("phase") != "done" else "done"


def _num(value: Any) -> int:
    return value if isinstance(value, int) else 0


def usage_line(state: dict[str, Any]) -> str:
    """Tokens and timings in one line: input (cached), output (reasoning), TTFT, tok/s, wall."""
    usage = state["response"].get("usage") or {}
    timing = state["view"].get("timing") or {}
    bits = []
    if usage:
        cached = _num((usage.get("input_tokens_details") or {}).get("cached_tokens"))
        reasoning = _num((usage.get("output_tokens_details") or {}).get("reasoning_tokens"))
        bits.append(
            f"input {_num(usage.get('input_tokens')):,}"
            + (f" ({cached:,} cached)" if cached else "")
        )
        bits.append(
            f"output {_num(usage.get('output_tokens')):,}"
            + (f" ({reasoning:,} reasoning)" if reasoning else "")
        )
    if timing.get("ttft") is not None:
        bits.append(f"first token {timing['ttft']:.2f} s")
    rate = tokens_per_second(state)
    if rate is not None:
        bits.append(f"{rate:.1f} tok/s")
    if timing.get("wall") is not None:
        bits.append(f"wall {timing['wall']:.2f} s")
    return " · ".join(bits)


def tokens_per_second(state: dict[str, Any]) -> float | None:
    """Output tokens over generation time (first to last token), when both are known."""
    usage = state["response"].get("usage") or {}
    generation = (state["view"].get("timing") or {}).get("generation")
    tokens = _num(usage.get("output_tokens")) or sum(
        _num(meta.get("deltas")) for meta in state["view"].get("items") or []
    )
    if not generation or generation <= 0 or not tokens:
        return None
    return tokens / generation
