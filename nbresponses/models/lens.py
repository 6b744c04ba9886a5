"""The logit lens graph: a variant of a prepared fused graph that reads every layer's residual
stream through the model's own final norm and LM head.

Why a variant and not a second model: the lens needs the hidden state after every layer, which
the decoding graph computes and throws away. The variant is the same graph (the same nodes and
the same weight file, read from the prepared model's folder) with a head per layer and a few
reductions added, so its outputs are small: per layer and position, the top-k tokens, the
logprob and rank of a given next token, and the KL divergence from the final layer's
distribution. It is built on demand and kept beside the model (``lens.onnx``), like a recipe's
files. On a quantized recipe it reads what that model computes: the residual stream after
8-bit weights and per-block int8 activations, through the quantized LM head.

Hidden state ``l`` (0 = the embeddings, ``L`` = the last layer's output, before the final norm)
is ``SimplifiedLayerNormalization(h_l, final gamma)`` then the LM head, as transformers'
``output_hidden_states`` gives ``h_0 .. h_{L-1}``; for ``L`` the graph's own ``final_norm``
output is used, so the last row is exactly the model's distribution.
"""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path
from typing import Any

from nbresponses.models.errors import RecipeError
from nbresponses.models.graph_contract import KV_LAYOUT, SCATTER_IN_PLACE
from nbresponses.models.kernels import DOMAIN

LENS_FILE = "lens.onnx"
LENS_VERSION = "1"  # bump when the variant changes: a kept lens.onnx of another version is rebuilt
LENS_META = "nbresponses.lens"
NEXT_IDS = "lens_next_ids"  # input [1, S]: the token whose probability each position reports
TOP_K = 10
OUTPUTS = ("lens_top_ids", "lens_top_logprobs", "lens_next_logprob", "lens_next_rank", "lens_kl")


class LensUnsupported(RecipeError):
    """The prepared model's graph is not one the lens can read (an Optimum export)."""


def lens_path(model_dir: Path) -> Path:
    """The lens graph of a prepared model, built on first use (atomically) and then reused."""
    import onnx

    target = model_dir / LENS_FILE
    if target.is_file():
        meta = {
            p.key: p.value for p in onnx.load(str(target), load_external_data=False).metadata_props
        }
        if meta.get(LENS_META) == LENS_VERSION:
            return target
    model = build_lens_graph(onnx.load(str(model_dir / "model.onnx"), load_external_data=False))
    handle, tmp = tempfile.mkstemp(prefix=".lens-", suffix=".onnx", dir=model_dir)
    os.close(handle)
    try:
        onnx.save_model(model, tmp)
        os.chmod(tmp, 0o644)
        os.replace(tmp, target)
    finally:
        Path(tmp).unlink(missing_ok=True)
    return target


def build_lens_graph(model: Any) -> Any:
    """The lens variant of a fused ``ModelProto`` (weights left where they are: external data
    of the same file). Raises ``LensUnsupported`` for graphs it cannot read."""
    from onnx import TensorProto, helper

    meta = {p.key: p.value for p in model.metadata_props}
    if meta.get(KV_LAYOUT) != SCATTER_IN_PLACE:
        raise LensUnsupported(
            "The logit lens reads the fused graph (recipes fused-q8, fused-fp32 = analysis, "
            "fused-q4, fused-int8); this model was prepared with an Optimum recipe or by an "
            "earlier version (prepare it again)."
        )
    graph = model.graph
    nodes = {n.name: n for n in graph.node}
    first, final = nodes.get("layers.0/input_norm"), nodes.get("final_norm")
    if first is None or final is None or "logits_positions" not in nodes:
        raise LensUnsupported("The fused graph lacks the nodes the lens reads (an old version?).")
    layers = sum(1 for n in nodes if re.fullmatch(r"layers\.\d+/post_norm", n))
    streams = [first.input[0]] + [f"layers.{i}.input_norm/sum" for i in range(1, layers)]
    ours = final.op_type == "SkipNorm"  # kernels/skip_norm.cc: the sum is its second output
    at = 1 if ours else 3  # ONNX Runtime's SkipSimplifiedLayerNormalization: its fourth
    for i in range(1, layers):  # each layer's input norm also writes the residual sum
        node = nodes[f"layers.{i}.input_norm"]
        if len(node.output) <= at or node.output[at] != streams[i]:
            raise LensUnsupported(f"layer {i}'s residual stream is not an output of its norm")
    epsilon = next(a.f for a in final.attribute if a.name == "epsilon")
    gamma = final.input[2]
    # the head: every node from the Slice of the final norm's output to ``logits``
    head = _head_chain(graph, "logits_positions/out0")
    added: list[Any] = []
    serial = iter(range(1 << 30))

    def apply_head(normed: str, tag: str) -> str:
        renamed = {"logits_positions/out0": normed}
        for node in head:
            outputs = [f"lens/{tag}/{o}" if o else o for o in node.output]
            renamed.update(zip(node.output, outputs, strict=True))
            added.append(
                helper.make_node(
                    node.op_type,
                    [renamed.get(i, i) for i in node.input],
                    outputs,
                    name=f"lens/{tag}/{node.name}",
                    domain=node.domain,
                )
            )
            added[-1].attribute.extend(node.attribute)
        return renamed["logits"]

    def op(kind: str, inputs: list[str], tag: str, domain: str = "", **attrs: Any) -> str:
        out = f"lens/{tag}/{kind}{next(serial)}"
        added.append(helper.make_node(kind, inputs, [out], name=out, domain=domain, **attrs))
        return out

    const = {
        "k": helper.make_tensor("lens/const/k", TensorProto.INT64, [1], [TOP_K]),
        "axis": helper.make_tensor("lens/const/axis", TensorProto.INT64, [1], [-1]),
    }
    graph.initializer.extend(const.values())
    next_ids = op("Unsqueeze", [NEXT_IDS, "lens/const/axis"], "next")  # [1, S, 1]
    layer_logprobs = []
    for layer in range(layers + 1):
        tag = f"layer{layer}"
        if layer < layers and ours:  # the norm the model's own layers compute
            normed = op("SkipNorm", [streams[layer], "", gamma], tag, DOMAIN, epsilon=epsilon)
        elif layer < layers:
            normed = op(
                "SimplifiedLayerNormalization",
                [streams[layer], gamma],
                tag,
                axis=-1,
                epsilon=epsilon,
                stash_type=1,
            )
        else:
            normed = final.output[0]  # the model's own final norm: the last row is its output
        logits = apply_head(normed, tag)
        layer_logprobs.append(op("LogSoftmax", [logits], tag, axis=-1))
    final_logprobs = layer_logprobs[-1]
    final_probs = op("Exp", [final_logprobs], "final")
    tops_v, tops_i, nexts, ranks, kls = [], [], [], [], []
    for layer, logprobs in enumerate(layer_logprobs):
        tag = f"layer{layer}"
        values, indices = f"lens/{tag}/top_values", f"lens/{tag}/top_ids"
        added.append(
            helper.make_node(
                "TopK", [logprobs, "lens/const/k"], [values, indices], name=f"lens/{tag}/TopK",
                axis=-1, largest=1, sorted=1,
            )
        )  # fmt: skip
        nxt = op("GatherElements", [logprobs, next_ids], tag, axis=-1)  # [1, S, 1]
        above = op("Greater", [logprobs, nxt], tag)
        above_count = op("Cast", [above], tag, to=TensorProto.INT64)
        rank = op("ReduceSum", [above_count, "lens/const/axis"], tag, keepdims=1)
        diff = op("Sub", [final_logprobs, logprobs], tag)
        kl = op("ReduceSum", [op("Mul", [final_probs, diff], tag), "lens/const/axis"], tag)
        tops_v.append(values)
        tops_i.append(indices)
        nexts.append(nxt)
        ranks.append(rank)
        kls.append(kl)
    # stacked over layers on axis 0: [L + 1, S, k] / [L + 1, S, 1]
    for name, parts in zip(OUTPUTS, (tops_i, tops_v, nexts, ranks, kls), strict=True):
        added.append(helper.make_node("Concat", parts, [name], name=f"lens/{name}", axis=0))
    graph.node.extend(added)
    graph.input.append(
        helper.make_tensor_value_info(NEXT_IDS, TensorProto.INT64, [1, "sequence_length"])
    )
    kinds = {
        "lens_top_ids": TensorProto.INT64,
        "lens_next_rank": TensorProto.INT64,
    }
    # The present KV stays an output (unread): with our KVAttention writing it, a float16 KV
    # that no graph output declares lets ONNX Runtime give the operator float32 copies of the
    # buffers (its cast insertion), and the lens would read unrounded keys the model never sees.
    kept = [o for o in graph.output if o.name.startswith("present.")]
    del graph.output[:]
    graph.output.extend(kept)
    for name in OUTPUTS:
        graph.output.append(
            helper.make_tensor_value_info(name, kinds.get(name, TensorProto.FLOAT), None)
        )
    helper.set_model_props(model, {**meta, LENS_META: LENS_VERSION})
    return model


def _head_chain(graph: Any, start: str) -> list[Any]:
    """The nodes that turn ``start`` (the kept positions of the final norm) into ``logits``:
    the LM head (MatMul or MatMulNBits) and, for Gemma, the soft cap."""
    producers = {o: n for n in graph.node for o in n.output if o}
    chain: list[Any] = []
    wanted = ["logits"]
    seen: set[str] = set()
    while wanted:
        tensor = wanted.pop()
        if tensor == start or tensor in seen:
            continue
        seen.add(tensor)
        node = producers.get(tensor)
        if node is None:
            continue  # an initializer or a graph input
        chain.append(node)
        wanted.extend(node.input)
    names = {id(n) for n in chain}
    return [n for n in graph.node if id(n) in names]  # in graph order
