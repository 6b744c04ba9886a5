"""Attention from standard ONNX operators: one computation for every step shape.

Why not GroupQueryAttention: on CPU it computes a one-token step with another kernel than a
multi-token step (its numbers differ by ~3e-7 at the same position), and it refuses a batch of
rows with more than one new token each and a past. So a verified speculation step, a decode step
that carries a prompt chunk, and a batch of prompts with cached prefixes could not give the
numbers a plain decode step gives. Written with MatMul and Softmax, attention gives a token the
same bits whatever the step shape, batch and buffer width (``benchmarks/attention.py`` and
``benchmarks/attention_layout.py`` measure it on one operator, ``tests/models/test_fused.py``
on whole graphs), because:

- each score is one dot product over the head (MLAS sums it in the same order for any number of
  rows of the matrix multiply, as long as there are at least two: a single row takes another
  kernel, so a model with one query head per KV head gets its queries twice);
- the Softmax and the probabilities x values sum over the buffer's columns from column 0, and
  the columns past a token's own position hold exact zeros after the mask (adding 0 changes
  no bit);
- the new keys and values are written into the bound buffers in place (ScatterND at each
  token's position, the same memory as the input), so no step copies the cache.

Layout: every row's tokens sit at columns 0..length-1 of ``[B, kv_heads, capacity, head_dim]``
buffers; a token at position p sees columns 0..p (and, on a sliding-window layer, only the last
``window`` of them). The caller gives buffers with room for the new columns. The queries of all
the step's positions that share a KV head are the rows of one product with that head's keys
(``[B, kv, S * group, head_dim]``, a transpose of the projection's ``[B, S, heads * head_dim]``),
so a prefill run packs each head's keys once, not once per position (measured in
``benchmarks/attention_layout.py``: the same bits as a product per position, 2-4x faster on
prompt runs of 64-370 tokens).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from nbresponses.models.kernels import DOMAIN


class GraphBuilder(Protocol):
    """What the attention needs of the fused builder's graph (``fused._Graph``)."""

    def weight(self, name: str, array: np.ndarray) -> str: ...

    def node(
        self,
        op: str,
        inputs: list[str],
        outputs: list[str] | int = 1,
        *,
        name: str,
        domain: str = "",
        **attrs: Any,
    ) -> list[str]: ...


@dataclass(frozen=True)
class Shape:
    heads: int
    kv_heads: int
    head_dim: int

    @property
    def duplicated(self) -> bool:
        return self.heads == self.kv_heads


class StepTensors:
    """Tensors every layer shares, computed once per run from ``position_ids`` and the buffer
    width: the mask as an additive bias, and the columns the new keys go to."""

    def __init__(self, g: GraphBuilder, shape: Shape, *, width_of: str) -> None:
        self.g, self.shape = g, shape
        self._consts: dict[str, str] = {}
        c = self._const
        node = g.node
        width = node(
            "Gather", [node("Shape", [width_of], name="kv_shape")[0], c("two", 2)], name="kv_width"
        )[0]
        columns = node(
            "Range",
            [
                c("zero_s", 0, scalar=True),
                node("Squeeze", [width], name="kv_width_s")[0],
                c("one_s", 1, scalar=True),
            ],
            name="columns",
        )[0]
        self._columns = columns  # [W]
        # [B, S * rows, 1]: the position of each query row of a KV head's product (each
        # position repeated for the query heads of its group), against the columns
        rows = self.rows
        repeated = node(
            "Expand",
            [
                node("Unsqueeze", ["position_ids", c("axis2", 2)], name="pos3")[0],
                c("one_one_rows", [1, 1, rows]),
            ],
            name="pos_rows",
        )[0]  # [B, S, rows]
        self._positions = node(
            "Reshape", [repeated, c("b_rows_1", [0, -1, 1])], name="pos_rows_flat"
        )[0]
        self._causal = node("LessOrEqual", [columns, self._positions], name="causal")[0]
        self.bias = self._bias(self._causal, "bias")
        self._windows: dict[int, str] = {}
        # [B, S, kv, 3]: (row, kv head, position) of each new key and value, for ScatterND,
        # which takes them in the projection's own [B, S, kv, head_dim] order (no transpose)
        ids_shape = node("Shape", ["position_ids"], name="ids_shape")[0]  # [B, S]
        index_shape = node(
            "Concat", [ids_shape, c("kv_one", [shape.kv_heads, 1])], name="index_shape", axis=0
        )[0]
        batch = node("Gather", [ids_shape, c("zero", 0, scalar=True)], name="batch")[0]
        batch_rows = node(
            "Range", [c("zero_s", 0, scalar=True), batch, c("one_s", 1, scalar=True)], name="rows"
        )[0]
        row_index = node("Reshape", [batch_rows, c("b111", [-1, 1, 1, 1])], name="row_index")[0]
        head_index = c("heads", np.arange(shape.kv_heads).reshape(1, 1, -1, 1))
        at = node("Unsqueeze", ["position_ids", c("axes23", [2, 3])], name="pos4")[0]
        sources = ((row_index, "rows"), (head_index, "heads"), (at, "positions"))
        parts = [node("Expand", [x, index_shape], name=f"index_{n}")[0] for x, n in sources]
        self.scatter_index = node("Concat", parts, name="scatter_index", axis=-1)[0]

    @property
    def rows(self) -> int:
        """Query rows per position and KV head: the group, or 2 where it is 1 (a one-row
        product would take another kernel)."""
        shape = self.shape
        return 2 if shape.duplicated else shape.heads // shape.kv_heads

    def _const(self, name: str, value: Any, *, scalar: bool = False) -> str:
        """An int64 constant, made once per graph whatever the number of layers using it."""
        if name not in self._consts:
            array = np.array(value, np.int64)
            self._consts[name] = self.g.weight(
                f"attn/const/{name}", array if scalar else np.atleast_1d(array)
            )
        return self._consts[name]

    const = _const

    def float16_range(self) -> tuple[str, str]:
        """float16's finite bounds as float scalars (made once per graph), for Clip."""
        if "float16_low" not in self._consts:
            top = float(np.finfo(np.float16).max)
            for name, value in (("float16_low", -top), ("float16_high", top)):
                bound = np.array(value, np.float32)
                self._consts[name] = self.g.weight(f"attn/const/{name}", bound)
        return self._consts["float16_low"], self._consts["float16_high"]

    def _bias(self, visible: str, name: str) -> str:
        """[B, S * rows, W] bool -> [B, 1, S * rows, W] float: 0 where visible, -inf elsewhere
        (it broadcasts over the KV heads of the scores [B, kv, S * rows, W])."""
        g, c = self.g, self._const
        zero = g.weight(f"attn/{name}/zero", np.array(0.0, np.float32))
        masked = g.weight(f"attn/{name}/masked", np.array(-np.inf, np.float32))
        bias = g.node("Where", [visible, zero, masked], name=f"attn/{name}/where")[0]
        return g.node("Unsqueeze", [bias, c("axis1", [1])], name=f"attn/{name}/heads")[0]

    def window_bias(self, window: int) -> str:
        """The bias of a sliding-window layer: a token at p sees the ``window`` keys after
        p - window (its own included), as transformers' ``sliding_window`` counts them
        (tests/models/test_fused_architectures.py compares with PyTorch past the window)."""
        if window not in self._windows:
            g, tag = self.g, f"attn/window{window}"
            start = g.node(
                "Sub",
                [self._positions, self._const(f"window{window}", window)],
                name=f"{tag}/start",
            )[0]
            recent = g.node("Greater", [self._columns, start], name=f"{tag}/recent")[0]
            visible = g.node("And", [self._causal, recent], name=f"{tag}/and")[0]
            self._windows[window] = self._bias(visible, f"window{window}")
        return self._windows[window]


def rotary(
    g: GraphBuilder, x: str, *, heads: int, cos: str, sin: str, rotary_dim: int | None, name: str
) -> str:
    """Rotate ``x`` [B, S, heads * head_dim] at ``position_ids`` (each token on its own)."""
    attrs: dict[str, Any] = {"interleaved": 0, "num_heads": heads}
    if rotary_dim is not None:
        attrs["rotary_embedding_dim"] = rotary_dim
    return g.node(
        "RotaryEmbedding", [x, "position_ids", cos, sin], name=name, domain="com.microsoft", **attrs
    )[0]


def write(
    g: GraphBuilder,
    step: StepTensors,
    *,
    name: str,
    k: str,
    v: str,
    past: tuple[str, str],
    present: tuple[str, str],
    stored: int | None = None,
) -> tuple[str, str]:
    """Write the new keys and values ``k``, ``v`` [B, S, kv * hd] (already rotated) into the
    bound buffers at ``position_ids`` (in place); returns the buffers [B, kv, W, hd] as stored.

    ``stored``: the buffers' ONNX element type when it is not float (``TensorProto.FLOAT16``
    only): new keys and values are clipped to its range and rounded as they are written."""
    kv, hd = step.shape.kv_heads, step.shape.head_dim

    def one(x: str, which: str, buffer: str, out: str) -> str:
        split = g.node(
            "Reshape", [x, step.const("bs_kv_hd", [0, 0, kv, hd])], name=f"{name}/{which}4"
        )
        if stored is not None:  # clipped first: a float16 past its range would be inf
            low, high = step.float16_range()
            split = g.node("Clip", [split[0], low, high], name=f"{name}/{which}_clip")
            split = g.node("Cast", split, name=f"{name}/{which}_store", to=stored)
        return g.node(
            "ScatterND", [buffer, step.scatter_index, split[0]], [out], name=f"{name}/{which}_write"
        )[0]

    return one(k, "k", past[0], present[0]), one(v, "v", past[1], present[1])


def attention(
    g: GraphBuilder,
    step: StepTensors,
    *,
    name: str,
    q: str,
    k: str,
    v: str,
    past: tuple[str, str],
    present: tuple[str, str],
    scale: float,
    softcap: float = 0.0,
    window: int | None = None,
    stored: int | None = None,
    int8_values: bool = False,
    kernel: bool = False,
    tables: tuple[str, str] | None = None,
    norms: tuple[str, str, float] | None = None,
) -> str:
    """Attention of ``q`` [B, S, heads * hd] over the buffers after writing ``k``, ``v``
    [B, S, kv * hd] (already rotated) into them; returns [B, S, heads * hd].

    ``kernel``: computed by our ``KVAttention`` operator (``kernels``) instead of the standard
    operators below: the same writes (made by the operator: the rounding of ``write``'s Clip and
    Cast, in place), then each token reads its own columns straight from the buffers, as stored
    (no fp32 copies, no masked columns), with the same contract. With ``kernel`` only: ``k`` and
    ``v`` empty when ``q`` is the packed projection [B, S, (heads + 2 kv) * hd], and ``tables``
    (cos, sin) when ``q`` and ``k`` are not rotated yet: the operator splits and rotates them as
    ``rotary`` and a Split would (the same bits, three nodes fewer a layer). ``norms`` (packed
    ``q`` only): the query and key heads' RMSNorm weights and epsilon (Qwen3, Gemma 3), applied
    by the operator before the rotary as ``SimplifiedLayerNormalization`` would (the same bits,
    seven nodes fewer a layer).

    ``stored``: the buffers' ONNX element type when it is not float (``TensorProto.FLOAT16``
    only): new keys and values are rounded to it as they are written (``write``) and every
    product reads the buffer back as float, so a token sees the same stored numbers whether
    they were written in this run or an earlier one (prefill == decode), and a step reads half
    the KV bytes. ``int8_values`` (``kernel`` only): the value buffers are int8 columns of
    head_dim values and their fp32 scale (``KVAttentionInt8Values``), whatever the keys' type."""
    from onnx import TensorProto

    shape = step.shape
    kv, hd = shape.kv_heads, shape.head_dim
    const = step.const
    if kernel:  # the operator writes the new keys and values itself (eight nodes fewer a layer)
        if norms is not None and k:
            raise ValueError("head norms are applied by KVAttention to the packed projection only")
        optional: dict[str, int | float] = {} if k else {"kv_heads": kv}  # packed heads
        inputs = [q, past[0], past[1], "position_ids", k, v]
        if tables is not None or norms is not None:
            inputs += tables or ("", "")
        if norms is not None:
            inputs += norms[:2]
            optional["epsilon"] = float(norms[2])
        return g.node(
            "KVAttentionInt8Values" if int8_values else "KVAttention",
            inputs,
            [f"{name}/kernel/out0", present[0], present[1]],
            name=f"{name}/kernel",
            domain=DOMAIN,
            heads=shape.heads,
            scale=float(scale),
            softcap=float(softcap),
            window=int(window or 0),
            **optional,
        )[0]
    if tables is not None or norms is not None or not k or int8_values:
        raise ValueError(
            "packed heads, rotary tables, head norms and int8 values are the KVAttention "
            "operator's only"
        )
    keys, values = write(g, step, name=name, k=k, v=v, past=past, present=present, stored=stored)
    if stored is not None:  # [B, kv, W, hd] as float
        keys, values = (
            g.node("Cast", [x], name=f"{name}/{which}_read", to=TensorProto.FLOAT)[0]
            for x, which in ((keys, "k"), (values, "v"))
        )
    group, rows = shape.heads // kv, step.rows
    queries = g.node(
        "Reshape", [q, const(f"bs_kv_{group * hd}", [0, 0, kv, group * hd])], name=f"{name}/q4"
    )[0]  # [B, S, kv, group * hd]
    if shape.duplicated:  # one query head per KV head: two rows, so the product takes MLAS's
        queries = g.node("Concat", [queries, queries], name=f"{name}/q_twice", axis=3)[0]
    queries = g.node("Transpose", [queries], name=f"{name}/q_heads", perm=[0, 2, 1, 3])[0]
    queries = g.node(
        "Reshape", [queries, const("b_kv_rows_hd", [0, 0, -1, hd])], name=f"{name}/q_rows"
    )[0]  # [B, kv, S * rows, hd]: one product per (row, KV head), all positions as its rows
    scores = g.node(
        "FusedMatMul",
        [queries, keys],
        name=f"{name}/scores",
        domain="com.microsoft",
        transB=1,
        alpha=float(scale),
    )[0]  # [B, kv, S * rows, W]
    if softcap:
        cap = g.weight(f"{name}/softcap", np.array(softcap, np.float32))
        scores = g.node("Div", [scores, cap], name=f"{name}/softcap_div")[0]
        scores = g.node("Tanh", [scores], name=f"{name}/softcap_tanh")[0]
        scores = g.node("Mul", [scores, cap], name=f"{name}/softcap_mul")[0]
    bias = step.bias if window is None else step.window_bias(window)
    scores = g.node("Add", [scores, bias], name=f"{name}/mask")[0]
    probs = g.node("Softmax", [scores], name=f"{name}/softmax", axis=-1)[0]
    context = g.node("MatMul", [probs, values], name=f"{name}/context")[0]  # [B, kv, S*rows, hd]
    context = g.node(
        "Reshape",
        [context, const(f"b_kv_s_{rows * hd}", [0, 0, -1, rows * hd])],
        name=f"{name}/context_positions",
    )[0]  # [B, kv, S, rows * hd]
    if shape.duplicated:
        context = g.node(
            "Slice",
            [context, const("zero1", [0]), const(f"hd{hd}", [hd]), const("axis3", [3])],
            name=f"{name}/context_once",
        )[0]
    context = g.node("Transpose", [context], name=f"{name}/context_tokens", perm=[0, 2, 1, 3])[0]
    return g.node(
        "Reshape", [context, const("b_s_hidden", [0, 0, shape.heads * hd])], name=f"{name}/context3"
    )[0]
