"""A colour-blind-safe colour scale (viridis) computed by hand, so frames need no matplotlib.

Viridis is perceptually uniform and readable with the common colour-vision deficiencies; the
11 anchors below are matplotlib's viridis at 0.0, 0.1, …, 1.0, interpolated linearly in sRGB.
"""

from __future__ import annotations

import numpy as np

__all__ = ["VIRIDIS_ANCHORS", "text_colors", "viridis"]

VIRIDIS_ANCHORS = (
    "#440154", "#482475", "#414487", "#355f8d", "#2a788e", "#21918c",
    "#22a884", "#44bf70", "#7ad151", "#bddf26", "#fde725",
)  # fmt: skip

_RGB = np.array([[int(h[i : i + 2], 16) for i in (1, 3, 5)] for h in VIRIDIS_ANCHORS], float)


def _rgb(values: np.ndarray) -> np.ndarray:
    x = np.clip(np.nan_to_num(np.asarray(values, dtype=float), nan=0.0), 0.0, 1.0)
    grid = np.linspace(0.0, 1.0, len(_RGB))
    return np.stack([np.interp(x, grid, _RGB[:, c]) for c in range(3)], axis=-1)


def viridis(values: np.ndarray) -> list[str]:
    """``#rrggbb`` for each value in [0, 1] (clipped; NaN maps to the low end)."""
    rgb = np.rint(_rgb(values)).astype(int)
    return [f"#{r:02x}{g:02x}{b:02x}" for r, g, b in rgb.tolist()]


def text_colors(values: np.ndarray) -> list[str]:
    """Black or white, whichever reads better on ``viridis(values)`` (relative luminance)."""
    rgb = _rgb(values) / 255.0
    linear = np.where(rgb <= 0.04045, rgb / 12.92, ((rgb + 0.055) / 1.055) ** 2.4)
    luminance = linear @ np.array([0.2126, 0.7152, 0.0722])
    return ["#000000" if y > 0.179 else "#ffffff" for y in luminance.tolist()]
