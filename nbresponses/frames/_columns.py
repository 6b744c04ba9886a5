"""Small constructors for the column dtypes the frames use.

Repeated strings (ids, tokens, event types) are categoricals: they pay off in memory and in
groupby. Free text is pandas' ``str`` dtype. Counts that can be missing are nullable ints.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

__all__ = ["categorical", "nullable_int", "repeat_categorical", "string"]


def categorical(values: Sequence[Any] | np.ndarray) -> pd.Categorical:
    """Categorical of strings; None becomes missing."""
    codes, uniques = pd.factorize(np.asarray(values, dtype=object), use_na_sentinel=True)
    categories = pd.Index(np.asarray(uniques, dtype=object), dtype="str")
    return pd.Categorical.from_codes(codes, categories=categories)


def repeat_categorical(values: Sequence[Any], counts: np.ndarray) -> pd.Categorical:
    """A per-part value repeated over the part's rows, without hashing every row."""
    part = categorical(values)
    return pd.Categorical.from_codes(np.repeat(part.codes, counts), dtype=part.dtype)


def string(values: Sequence[str]) -> pd.api.extensions.ExtensionArray:
    """pandas' default string dtype (Arrow-backed when pyarrow is installed)."""
    return pd.array(values, dtype="str")


def nullable_int(values: np.ndarray, dtype: str = "Int64") -> pd.api.extensions.ExtensionArray:
    """Nullable integers from floats with NaN for missing."""
    mask = np.isnan(values)
    ints = np.where(mask, 0, values).astype(dtype.lower())
    return pd.arrays.IntegerArray(ints, mask)
