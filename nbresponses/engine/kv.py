"""The running batch's KV cache: one left-padded tensor per layer input, kept between steps.

Rows of different lengths share one tensor per layer ([B, kv_heads, L, head_dim]); a row shorter
than L is padded on the left and masked out by ``attention_mask``, and its position ids count
only its own tokens, so padding changes nothing but the width of the attention. Between steps the
tensors stay ONNX Runtime OrtValues (the previous step's ``present.*`` outputs fed back as
``past_key_values.*``); they become numpy arrays only when rows join or leave.

In-place mode (graphs whose attention appends to the cache in place, such as the fused graph's
GroupQueryAttention): the tensors are buffers with spare columns, bound as both the past input
and the present output, so a decode step writes one column instead of copying the whole cache
(a copy that grows with batch x length and dominated attention at batch 16). Columns past
``length`` are scratch; the buffers are re-made only when rows join or leave or room runs out.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

HEADROOM = 128  # spare columns of an in-place buffer: a re-allocation every HEADROOM steps at most

RowKV = list[np.ndarray]  # one [kv_heads, T, head_dim] array per past input, in input order

_ONNX_DTYPES = {"tensor(float)": np.float32, "tensor(float16)": np.float16}


@dataclass(frozen=True)
class KVLayout:
    """Names and shapes of the model's KV inputs and outputs."""

    past_names: tuple[str, ...]
    present_names: tuple[str, ...]
    kv_heads: int
    head_dim: int
    dtype: np.dtype

    @classmethod
    def from_session(cls, session: Any) -> KVLayout:
        pasts = [i for i in session.get_inputs() if i.name.startswith("past_key_values.")]
        if not pasts:
            raise ValueError("the model has no past_key_values inputs (exported without KV cache)")
        outputs = {o.name for o in session.get_outputs()}
        presents = tuple(p.name.replace("past_key_values.", "present.") for p in pasts)
        missing = [name for name in presents if name not in outputs]
        if missing:
            raise ValueError(f"the model lacks KV outputs {missing[:3]}")
        _, kv_heads, _, head_dim = pasts[0].shape
        return cls(
            past_names=tuple(p.name for p in pasts),
            present_names=presents,
            kv_heads=int(kv_heads),
            head_dim=int(head_dim),
            dtype=np.dtype(_ONNX_DTYPES.get(pasts[0].type, np.float32)),
        )

    @property
    def bytes_per_token(self) -> int:
        return len(self.past_names) * self.kv_heads * self.head_dim * self.dtype.itemsize

    def empty(self, batch: int = 1) -> list[np.ndarray]:
        shape = (batch, self.kv_heads, 0, self.head_dim)
        return [np.zeros(shape, self.dtype) for _ in self.past_names]


def row_bytes(row: RowKV) -> int:
    return sum(a.nbytes for a in row)


class BatchKV:
    """KV tensors, left padding and positions of the rows currently decoding."""

    def __init__(self, layout: KVLayout, *, in_place: bool = False) -> None:
        self.layout = layout
        self.in_place = in_place
        self.pads: list[int] = []
        self.length = 0  # L: columns of every KV tensor holding tokens (or padding)
        self._values: list[Any] = []  # numpy arrays or OrtValues, [B, kv, L (or capacity), hd]
        self._bound: list[Any] = []  # in place: OrtValues over ``_values`` (same memory)

    @property
    def size(self) -> int:
        return len(self.pads)

    @property
    def nbytes(self) -> int:
        return self.size * self.length * self.layout.bytes_per_token

    @property
    def capacity(self) -> int:
        return self._values[0].shape[2] if self.in_place and self._values else self.length

    def _numpy(self) -> list[np.ndarray]:
        if self.in_place:
            return [a[:, :, : self.length] for a in self._values]
        return [v if isinstance(v, np.ndarray) else v.numpy() for v in self._values]

    def _alloc(self, like: np.ndarray, rows: int, width: int) -> np.ndarray:
        """A zeroed [rows, kv, width (+ headroom in place), hd] array."""
        columns = width + HEADROOM if self.in_place else width
        return np.zeros((rows, like.shape[-3], columns, like.shape[-1]), like.dtype)

    def _adopt(self, arrays: list[np.ndarray]) -> None:
        self._values = arrays
        if self.in_place:
            import onnxruntime as ort

            self._bound = [ort.OrtValue.ortvalue_from_numpy(a) for a in arrays]

    def add_rows(self, rows: list[RowKV]) -> None:
        """Append rows (their KV without padding), widening everything on the left to the
        longest, in one re-allocation: requests admitted together cost one copy, not one each
        (16 arrivals re-made the whole batch 16 times, 3% of a 16-way run)."""
        if not rows:
            return
        widths = [row[0].shape[1] for row in rows]
        width = max(self.length, *widths)
        grow = width - self.length
        old = self._numpy() if self.pads else [None] * len(rows[0])
        merged = []
        for i, batch in enumerate(old):
            like = rows[0][i]
            out = self._alloc(like, self.size + len(rows), width)
            if batch is not None:
                out[: self.size, :, grow:width] = batch
            for j, (row, tokens) in enumerate(zip(rows, widths, strict=True)):
                out[self.size + j, :, width - tokens : width] = row[i]
            merged.append(out)
        self._adopt(merged)
        self.pads = [p + grow for p in self.pads] + [width - tokens for tokens in widths]
        self.length = width

    def remove(self, indices: list[int]) -> None:
        """Drop rows; trim columns that became padding in every remaining row."""
        if not indices:
            return
        keep = [i for i in range(self.size) if i not in set(indices)]
        if not keep:
            self.pads, self.length, self._values, self._bound = [], 0, [], []
            return
        trim = min(self.pads[i] for i in keep)
        width = self.length - trim
        if self.in_place:
            kept = []
            for a in self._numpy():
                out = self._alloc(a, len(keep), width)
                out[:, :, :width] = a[keep, :, trim:]
                kept.append(out)
        else:
            kept = [np.ascontiguousarray(a[keep, :, trim:]) for a in self._numpy()]
        self._adopt(kept)
        self.pads = [self.pads[i] - trim for i in keep]
        self.length = width

    def row(self, index: int) -> RowKV:
        """A copy of one row's KV without its padding (for the prefix cache)."""
        pad = self.pads[index]
        return [np.array(a[index, :, pad:]) for a in self._numpy()]

    def inputs(self) -> list[Any]:
        """The past for the next step; in place, OrtValue buffers with room for one more column.

        The list object stays the same between re-allocations, so a runner can keep its
        bindings while ``inputs() is`` what it bound last time.
        """
        if not self.in_place:
            return self._values
        if self.length + 1 > self.capacity:
            grown = []
            for a in self._values:
                out = self._alloc(a, a.shape[0], self.length)
                out[:, :, : self.length] = a[:, :, : self.length]
                grown.append(out)
            self._adopt(grown)
        return self._bound

    def attention_mask(self) -> np.ndarray:
        """[B, L + 1]: zeros over each row's padding, ones over its tokens and the new one."""
        mask = np.ones((self.size, self.length + 1), np.int64)
        for i, pad in enumerate(self.pads):
            mask[i, :pad] = 0
        return mask

    def positions(self) -> np.ndarray:
        """[B, 1]: the position of each row's next token (its own token count so far)."""
        return np.array([[self.length - pad] for pad in self.pads], np.int64)

    def advance(self, presents: list[Any]) -> None:
        """Adopt the step's outputs (one column longer) as the new past.

        In place the step wrote its column into the buffers themselves: only the length moves.
        """
        if not self.in_place:
            self._values = presents
        self.length += 1
