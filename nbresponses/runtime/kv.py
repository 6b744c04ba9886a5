"""The running batch's KV cache, in a layout that makes a row's numbers independent of its mates.

A token's logits must be a function of its own request alone (docs/concepts/determinism.md). A
float sum changes when its terms move to other SIMD lanes or blocks, so a row's keys must sit at
the same columns whatever rows share the batch. Two layouts keep that:

``EndPaddedKV`` (graphs marked ``kv_layout=end``, such as the fused graph): one buffer per layer
input, [B, kv_heads, capacity, head_dim], each row's tokens at columns 0..length-1 and unused
columns after them; ``attention_mask`` has a row's ones first, so GroupQueryAttention reads each
row's own length (``seqlens_k``) and appends the new column in place at that row's own position.
A decode step writes one column per row instead of copying the cache. A row that leaves is
replaced by the last row (one row copied); a row that joins takes a spare row when one is
left and its tokens fit; buffers are re-made only when none is, when room runs out (``HEADROOM``
spare columns), or to give memory back when at most half the rows are in use.

``SeparateKV`` (every other graph, e.g. the Optimum export, whose attention appends the new key
after the longest row and so would shift a shorter row's last key): each row keeps its own
unpadded KV and decodes in a run of its own. Exact, at the speed of batch 1 per row.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

HEADROOM = 128  # spare columns of an in-place buffer: a re-allocation every HEADROOM steps at most
# Graphs whose attention reads every column of the buffer (``models/attention.py``) pay for
# spare columns in every step; fewer of them, re-allocated more often, cost less.
SCATTER_HEADROOM = 32

RowKV = list[np.ndarray]  # one [kv_heads, T, width] array per past input, in input order

# a graph input's KV type -> numpy (the fused graphs: float, or float16 for fused-int8, whose
# kernel recipe keeps its values in int8)
ONNX_KV_DTYPES = {
    "tensor(float)": np.float32,
    "tensor(float16)": np.float16,
    "tensor(int8)": np.int8,
}


@dataclass(frozen=True)
class KVBuffer:
    """One past input's buffers: [B, kv_heads, columns, width] of ``dtype``. ``width``: the head
    size, or more where a column carries more than its numbers (fused-int8-kernel's int8 values:
    the head's values, then their fp32 scale's 4 bytes). The engine only moves whole columns."""

    kv_heads: int
    width: int
    dtype: np.dtype

    @classmethod
    def of_input(cls, spec: Any) -> KVBuffer:
        """The buffer an ONNX Runtime input (``session.get_inputs()``) takes."""
        _, kv_heads, _, width = spec.shape
        return cls(int(kv_heads), int(width), np.dtype(ONNX_KV_DTYPES.get(spec.type, np.float32)))

    @property
    def bytes_per_column(self) -> int:
        return self.kv_heads * self.width * self.dtype.itemsize

    def zeros(self, columns: int, batch: int | None = None) -> np.ndarray:
        """``columns`` zeroed columns: one row's [kv_heads, columns, width], or ``batch`` rows'."""
        shape = (self.kv_heads, columns, self.width)
        return np.zeros(shape if batch is None else (batch, *shape), self.dtype)


@dataclass(frozen=True)
class KVLayout:
    """Names and buffers of the model's KV inputs and outputs (``buffers``: one per past input,
    in input order; keys and values may differ)."""

    past_names: tuple[str, ...]
    present_names: tuple[str, ...]
    buffers: tuple[KVBuffer, ...]

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
        return cls(
            past_names=tuple(p.name for p in pasts),
            present_names=presents,
            buffers=tuple(KVBuffer.of_input(p) for p in pasts),
        )

    @classmethod
    def uniform(
        cls,
        past_names: tuple[str, ...],
        present_names: tuple[str, ...],
        *,
        kv_heads: int,
        head_dim: int,
        dtype: np.dtype,
    ) -> KVLayout:
        """Every buffer alike (the exports of other tools; tests)."""
        buffer = KVBuffer(kv_heads, head_dim, np.dtype(dtype))
        return cls(past_names, present_names, (buffer,) * len(past_names))

    @property
    def bytes_per_token(self) -> int:
        return sum(b.bytes_per_column for b in self.buffers)

    def empty(self, batch: int = 1) -> list[np.ndarray]:
        return [b.zeros(0, batch) for b in self.buffers]

    def zeros(self, columns: int) -> RowKV:
        """One row's KV of ``columns`` zeroed columns (benchmarks, warm-ups)."""
        return [b.zeros(columns) for b in self.buffers]


def row_bytes(row: RowKV) -> int:
    return sum(a.nbytes for a in row)


class Runner(Protocol):
    """What a KV layout needs of the runner (``runner.OnnxRunner``)."""

    def run(
        self,
        input_ids: np.ndarray,
        attention_mask: np.ndarray,
        position_ids: np.ndarray,
        past: list[Any],
        *,
        in_place: bool = False,
    ) -> tuple[np.ndarray, list[Any]]: ...


class StepsRunner(Protocol):
    """What multi-token steps need of the runner (``runner.OnnxRunner.run_steps``)."""

    def run_steps(
        self, input_ids: np.ndarray, position_ids: np.ndarray, past: list[Any], keep: int = 0
    ) -> np.ndarray: ...


class DecodingRows(Protocol):
    """The KV of the rows decoding now, and the one call that advances them all by a token."""

    @property
    def size(self) -> int: ...

    @property
    def lengths(self) -> list[int]: ...

    @property
    def nbytes(self) -> int: ...

    def add_rows(self, rows: list[RowKV]) -> None: ...

    def remove(self, indices: list[int]) -> list[int]:
        """Drop rows ``indices``; return the kept rows' old indices in their new order."""
        ...

    def row(self, index: int) -> RowKV: ...

    def step(self, runner: Runner, token_ids: list[int]) -> np.ndarray:
        """Feed each row its next token; return the logits [B, vocab] (row i for row i)."""
        ...


class EndPaddedKV:
    """In-place buffers with every row's tokens at the start; one batched run per decode step."""

    def __init__(self, layout: KVLayout, *, reads_every_column: bool = False) -> None:
        self.layout = layout
        self.reads_every_column = reads_every_column  # picks the headroom (module constants)
        self.lengths: list[int] = []
        self._store: list[np.ndarray] = []  # [rows allocated, kv, capacity, hd] per past input
        self._values: list[np.ndarray] = []  # the first B rows of each: [B, kv, capacity, hd]
        self._bound: list[Any] = []  # OrtValues over ``_values`` (same memory)

    @property
    def size(self) -> int:
        return len(self.lengths)

    @property
    def width(self) -> int:
        """Columns holding tokens in the longest row."""
        return max(self.lengths, default=0)

    @property
    def capacity(self) -> int:
        return self._values[0].shape[2] if self._values else 0

    @property
    def nbytes(self) -> int:
        """Bytes allocated, spare rows included."""
        rows = len(self._store[0]) if self._store else 0
        return rows * self.capacity * self.layout.bytes_per_token

    def _make(self, rows: list[tuple[list[np.ndarray], int]], spare: int = 0) -> None:
        """New buffers holding ``rows`` (per-input [kv, >=length, hd] arrays and a length)."""
        headroom = SCATTER_HEADROOM if self.reads_every_column else HEADROOM
        columns = max(length for _, length in rows) + headroom + spare
        arrays = []
        for i in range(len(self.layout.past_names)):
            like = rows[0][0][i]
            out = np.zeros((len(rows), like.shape[-3], columns, like.shape[-1]), like.dtype)
            for j, (row, length) in enumerate(rows):
                out[j, :, :length] = row[i][:, :length]
            arrays.append(out)
        self._store = arrays
        self._use([length for _, length in rows])

    def _use(self, lengths: list[int]) -> None:
        """Run on the first ``len(lengths)`` rows of the store (a contiguous view, no copy)."""
        import onnxruntime as ort

        self.lengths = lengths
        self._values = [a[: len(lengths)] for a in self._store]
        self._bound = [ort.OrtValue.ortvalue_from_numpy(a) for a in self._values]

    def _rows(self) -> list[tuple[list[np.ndarray], int]]:
        return [([a[j] for a in self._values], n) for j, n in enumerate(self.lengths)]

    def add_rows(self, rows: list[RowKV]) -> None:
        """Append rows (their unpadded KV): into rows left spare by requests that finished
        when they fit, copying the newcomers only; else in one re-allocation, so requests
        admitted together cost one copy of the batch, not one each."""
        if not rows:
            return
        size, lengths = self.size, [row[0].shape[1] for row in rows]
        spare = len(self._store[0]) - size if self._store else 0
        if len(rows) > spare or max(lengths) + 1 > self.capacity:  # (a re-make leaves room)
            self._make(self._rows() + list(zip(rows, lengths, strict=True)))
            return
        for j, (row, n) in enumerate(zip(rows, lengths, strict=True)):
            for store, new in zip(self._store, row, strict=True):
                store[size + j, :, :n] = new[:, :n]
                store[size + j, :, n:] = 0  # no trace of the row's previous tenant
        self._use(self.lengths + lengths)

    def remove(self, indices: list[int]) -> list[int]:
        """Fill each gap with a row from the end (a copy of the rows that move, not of the
        batch: every finished request re-made the whole batch's KV, ~2% of a 16-request
        run); the rows left at the end stay allocated for the next admission, unless at most
        half are in use (then one re-make gives the memory back). A row's place in the batch
        does not change its numbers; the caller re-orders its rows as returned."""
        gone = set(indices)
        kept = [j for j in range(self.size) if j not in gone]
        if not gone:
            return kept
        if not kept:
            self.lengths, self._store, self._values, self._bound = [], [], [], []
            return kept
        if 2 * len(kept) <= len(self._store[0]):
            rows = self._rows()
            self._make([rows[j] for j in kept])
            return kept
        size = len(kept)
        order = list(range(size))
        holes = [j for j in sorted(gone) if j < size]
        movers = [j for j in kept if j >= size]  # as many as the holes
        for hole, mover in zip(holes, movers, strict=True):
            for store in self._store:
                store[hole] = store[mover]  # the whole row, its spare columns too
            order[hole] = mover
        self._use([self.lengths[j] for j in order])
        return order

    def truncate(self, index: int, length: int) -> None:
        """Forget row ``index``'s columns from ``length`` on (drafted tokens not kept)."""
        if not 0 <= length <= self.lengths[index]:
            raise ValueError(f"row {index} holds {self.lengths[index]} tokens, not {length}")
        self.lengths[index] = length

    def row(self, index: int) -> RowKV:
        """A copy of one row's KV without its padding."""
        n = self.lengths[index]
        return [np.array(a[index, :, :n]) for a in self._values]

    def step_tokens(
        self, runner: StepsRunner, tokens: list[list[int]], keep: int = 0
    ) -> np.ndarray:
        """Feed row i the tokens ``tokens[i]`` (at least one each; graphs with
        ``runner.exact_steps`` only); returns the logits of every position, [B, S, vocab],
        where S is the longest list, or of the last ``keep`` positions, [B, keep, vocab]. Shorter
        rows are padded after their own tokens: the padding's keys land in the row's spare
        columns, past its length, where no token looks and the next step overwrites them."""
        count = max(len(t) for t in tokens)
        if self.width + count > self.capacity:  # room for this step and the headroom after it
            self._make(self._rows(), spare=count)
        ids = np.array([t + t[-1:] * (count - len(t)) for t in tokens], np.int64)
        positions = np.array([[n + j for j in range(count)] for n in self.lengths], np.int64)
        logits = runner.run_steps(ids, positions, self._bound, keep)
        self.lengths = [n + len(t) for n, t in zip(self.lengths, tokens, strict=True)]
        return logits

    def step(self, runner: Runner, token_ids: list[int]) -> np.ndarray:
        if self.width + 1 > self.capacity:  # no spare column left for the longest row
            self._make(self._rows())
        width = self.width + 1
        mask = np.zeros((self.size, width), np.int64)
        for j, n in enumerate(self.lengths):
            mask[j, : n + 1] = 1
        ids = np.array([[t] for t in token_ids], np.int64)
        positions = np.array([[n] for n in self.lengths], np.int64)
        logits, _ = runner.run(ids, mask, positions, self._bound, in_place=True)
        self.lengths = [n + 1 for n in self.lengths]
        return logits


class SeparateKV:
    """Each row its own KV and its own run: exact for any graph, batch-1 speed per row."""

    def __init__(self, layout: KVLayout) -> None:
        self.layout = layout
        self._pasts: list[list[Any]] = []  # per row: numpy arrays or OrtValues, [1, kv, T, hd]
        self.lengths: list[int] = []

    @property
    def size(self) -> int:
        return len(self.lengths)

    @property
    def nbytes(self) -> int:
        return sum(self.lengths) * self.layout.bytes_per_token

    def add_rows(self, rows: list[RowKV]) -> None:
        for row in rows:
            self._pasts.append([a[None] for a in row])
            self.lengths.append(row[0].shape[1])

    def remove(self, indices: list[int]) -> list[int]:
        gone = set(indices)
        kept = [j for j in range(self.size) if j not in gone]
        self._pasts = [self._pasts[j] for j in kept]
        self.lengths = [self.lengths[j] for j in kept]
        return kept

    def row(self, index: int) -> RowKV:
        return [_numpy(v)[0] for v in self._pasts[index]]

    def step(self, runner: Runner, token_ids: list[int]) -> np.ndarray:
        out = []
        for j, (token, n) in enumerate(zip(token_ids, self.lengths, strict=True)):
            logits, self._pasts[j] = runner.run(
                np.array([[token]], np.int64),
                np.ones((1, n + 1), np.int64),
                np.array([[n]], np.int64),
                self._pasts[j],
            )
            out.append(logits[0])
        self.lengths = [n + 1 for n in self.lengths]
        return np.stack(out)


def _numpy(value: Any) -> np.ndarray:
    return np.array(value) if isinstance(value, np.ndarray) else value.numpy()
