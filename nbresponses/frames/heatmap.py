"""Tokens coloured by probability, as a pandas Styler (renders in Jupyter, exports to HTML)."""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Any

import pandas as pd

from nbresponses.traffic.lookup import ResponseLookup

from ._colors import text_colors, viridis
from .logprobs import logprobs_frame

if TYPE_CHECKING:  # pandas' Styler needs jinja2: import it only when a heat map is drawn
    from pandas.io.formats.style import Styler

__all__ = ["logprobs_heatmap", "plot_logprobs"]

_SHOWN = ["response_id", "position", "text", "prob", "logprob", "rank", "runner_up", "margin"]


def _visible(text: str) -> str:
    """Make whitespace tokens visible; a heat-map cell of spaces says nothing."""
    return text.replace(" ", "␣").replace("\n", "↵").replace("\t", "⇥") if text else "∅"


def plot_logprobs(
    obj: Any, *, max_rows: int | None = 2000, lookup: ResponseLookup | None = None
) -> Styler:
    """A Styler of the tokens of ``obj`` with ``text`` and ``prob`` cells coloured by ``prob``.

    Colours are viridis (dark purple = unlikely, yellow = likely), readable with colour-vision
    deficiencies; whitespace shows as ␣ ↵ ⇥ and empty text (part of a multi-byte character)
    as ∅. ``obj`` is anything :func:`logprobs_frame` accepts (stored ids read through
    ``lookup=``), or its frame. ``max_rows`` caps the rows rendered (None for all).
    ``.to_html()`` gives standalone HTML.
    """
    frame = obj if isinstance(obj, pd.DataFrame) else logprobs_frame(obj, lookup=lookup)
    shown = frame[_SHOWN].head(max_rows) if max_rows is not None else frame[_SHOWN]
    shown = shown.assign(text=shown["text"].map(_visible, na_action="ignore"))
    probs = shown["prob"].to_numpy(dtype=float)
    css = [
        f"background-color: {bg}; color: {fg}; white-space: pre"
        for bg, fg in zip(viridis(probs), text_colors(probs), strict=True)
    ]

    def colour(column: pd.Series) -> list[str]:
        return css if column.name in ("text", "prob") else [""] * len(column)

    styler = shown.style.apply(colour, axis=0).hide(axis="index")
    styler = styler.format(
        {"prob": "{:.3f}", "logprob": "{:.3f}", "margin": "{:.3f}"}, na_rep="", escape="html"
    )
    return styler.set_caption("token probability: viridis, dark = unlikely, yellow = likely")


def logprobs_heatmap(*args: Any, **kwargs: Any) -> Styler:
    """Deprecated name of :func:`plot_logprobs` (every plot is ``plot_*``)."""
    warnings.warn("logprobs_heatmap is now plot_logprobs", DeprecationWarning, stacklevel=2)
    return plot_logprobs(*args, **kwargs)
