"""The logit lens as a DataFrame (one row per layer and position) and a layers x positions heat
map. Built from plain arrays (``Engine.logit_lens`` computes them), so this module needs
nothing of the engine."""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from ._colors import text_colors, viridis
from .heatmap import _visible

if TYPE_CHECKING:
    from pandas.io.formats.style import Styler

__all__ = ["LENS_COLUMNS", "lens_frame", "lens_heatmap", "plot_lens"]

#: column -> dtype of :func:`lens_frame`
LENS_COLUMNS: dict[str, str] = {
    "layer": "int64",
    "position": "int64",
    "token": "str",
    "next_token": "str",
    "next_prob": "float64",
    "next_logprob": "float64",
    "next_rank": "Int64",
    "top_token": "str",
    "top_prob": "float64",
    "kl": "float64",
    "top_tokens": "object",
    "top_probs": "object",
}


def lens_frame(
    *,
    tokens: Sequence[str],
    top_tokens: np.ndarray,
    top_logprobs: np.ndarray,
    next_logprob: np.ndarray,
    next_rank: np.ndarray,
    kl: np.ndarray,
) -> pd.DataFrame:
    """One row per (layer, position) of a logit lens: ``layer`` 0 is the embeddings and the
    last layer the model's own output; position ``p`` has read ``tokens[: p + 1]``.

    ``next_token`` is ``tokens[p + 1]`` and ``next_prob`` / ``next_logprob`` / ``next_rank``
    (1 = the most likely) what the layer gives it (NaN / NA at the last position);
    ``top_token`` / ``top_prob`` the layer's most likely token, ``top_tokens`` / ``top_probs``
    its best ``k``; ``kl`` is KL(final || layer) in nats (0 at the last layer).
    Arrays are [layers, positions] (``top_*``: [layers, positions, k]).
    """
    layers, count = next_logprob.shape
    token_array = np.asarray(list(tokens), dtype=object)
    nxt = np.concatenate([token_array[1:], np.array([""], dtype=object)])
    probs = np.exp(top_logprobs)
    ranks = np.asarray(next_rank, np.float64).reshape(-1)
    columns = {
        "layer": np.repeat(np.arange(layers, dtype=np.int64), count),
        "position": np.tile(np.arange(count, dtype=np.int64), layers),
        "token": pd.array(np.tile(token_array, layers), dtype="str"),
        "next_token": pd.array(np.tile(nxt, layers), dtype="str"),
        "next_prob": np.exp(next_logprob).reshape(-1),
        "next_logprob": np.asarray(next_logprob, np.float64).reshape(-1),
        "next_rank": pd.array(
            [None if np.isnan(r) else int(r) for r in ranks.tolist()], dtype="Int64"
        ),
        "top_token": pd.array(top_tokens[:, :, 0].reshape(-1), dtype="str"),
        "top_prob": probs[:, :, 0].reshape(-1),
        "kl": np.asarray(kl, np.float64).reshape(-1),
        "top_tokens": [list(t) for t in top_tokens.reshape(layers * count, -1)],
        "top_probs": [list(p) for p in probs.reshape(layers * count, -1).tolist()],
    }
    frame = pd.DataFrame({name: columns[name] for name in LENS_COLUMNS})
    frame["top_tokens"] = frame["top_tokens"].astype(object)
    return frame


def plot_lens(frame: pd.DataFrame, value: str = "next_prob") -> Styler:
    """Layers (rows, the output at the top) x positions (columns, headed by the token read
    there and the one that comes next), each cell ``value`` (default: the probability the
    layer gives the next token), coloured viridis (dark = low, yellow = high; ``kl`` scaled to
    its largest value) and labelled with the layer's top token."""
    table = frame.pivot(index="layer", columns="position", values=value).sort_index(ascending=False)
    labels = frame.pivot(index="layer", columns="position", values="top_token").sort_index(
        ascending=False
    )
    heads = frame[frame["layer"] == frame["layer"].min()].set_index("position")
    table.columns = [
        f"{p}: {_visible(heads.at[p, 'token'])} → {_visible(heads.at[p, 'next_token'])}"
        for p in table.columns
    ]
    values = table.to_numpy(dtype=float)
    scale = np.nanmax(values) if value == "kl" and np.isfinite(values).any() else 1.0
    flat = (values / (scale or 1.0)).reshape(-1)
    background = np.array(viridis(flat)).reshape(values.shape)
    foreground = np.array(text_colors(flat)).reshape(values.shape)
    css = pd.DataFrame(
        [
            [
                f"background-color: {b}; color: {f}; white-space: pre"
                for b, f in zip(bs, fs, strict=True)
            ]
            for bs, fs in zip(background, foreground, strict=True)
        ],
        index=table.index,
        columns=table.columns,
    )
    shown = pd.DataFrame(labels.map(_visible).to_numpy(), index=table.index, columns=table.columns)
    caption = f"logit lens: {value} per layer (rows, output at the top) and position; cells name "
    caption += "the layer's top token"
    return shown.style.apply(lambda _: css, axis=None).set_caption(caption)


def lens_heatmap(*args: Any, **kwargs: Any) -> Styler:
    """Deprecated name of :func:`plot_lens` (every plot is ``plot_*``)."""
    warnings.warn("lens_heatmap is now plot_lens", DeprecationWarning, stacklevel=2)
    return plot_lens(*args, **kwargs)
