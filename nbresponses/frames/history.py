"""The history's rows (``nbr.history()``, read from the store by ``service/history.py``) as a
DataFrame: the columns, their types and the empty frame, here with the other frames."""

from __future__ import annotations

import json
from typing import Any

import pandas as pd

COLUMNS = [
    "id", "created_at", "status", "model", "origin", "input", "output", "input_tokens",
    "output_tokens", "reasoning_tokens", "cached_tokens", "metadata", "error",
    "previous_response_id", "background", "recipe", "model_hash", "recorded_at",
]  # fmt: skip
_INT_COLUMNS = ("input_tokens", "output_tokens", "reasoning_tokens", "cached_tokens")


def history_frame(rows: list[dict[str, Any]]) -> pd.DataFrame:
    """One row per stored response: times as UTC timestamps, metadata as dicts, counts as
    nullable integers (a recorded response may lack some)."""
    if not rows:
        return pd.DataFrame({c: pd.Series(dtype=object) for c in COLUMNS})
    frame = pd.DataFrame(rows, columns=COLUMNS)
    frame["created_at"] = pd.to_datetime(frame["created_at"], unit="s", utc=True)
    frame["recorded_at"] = pd.to_datetime(frame["recorded_at"], unit="s", utc=True)
    frame["metadata"] = [json.loads(m) if m else {} for m in frame["metadata"]]
    frame["background"] = frame["background"].astype(bool)
    for column in _INT_COLUMNS:
        frame[column] = frame[column].astype("Int64")
    return frame
