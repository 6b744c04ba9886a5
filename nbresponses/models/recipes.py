"""Quantization recipes, selectable by name. Each turns the fp32 export into a model file.

Why these (docs/concepts/measurements.md): Optimum's dynamic int8 uses one activation scale per
tensor, which changes answers from the first token and makes them depend on batch-mates. ONNX
Runtime's MatMulNBits with ``accuracy_level=4`` quantizes activations per block and still runs the
AVX512-VNNI int8 kernels, keeping ~96% top-1 agreement with fp32 on the broad fidelity set.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from nbresponses.models import fused, kernels
from nbresponses.models.cpu import has_vnni
from nbresponses.models.errors import RecipeError
from nbresponses.models.smoothing import Smoothing, activation_peaks

MODEL_FILE = "model.onnx"


@dataclass(frozen=True)
class Recipe:
    """A named way to make the model file. Most transform the Optimum fp32 export (``build``);
    graph builders of our own read the source's weights instead (``from_source``) and need no
    export at all."""

    name: str
    description: str
    build: Callable[[Path, Path], None] | None = None  # (fp32 model file, output model file)
    params: dict[str, Any] = field(default_factory=dict)
    # (source_model.SourceModel, output model file)
    from_source: Callable[[Any, Path], None] | None = None
    # raises UnsupportedArchitecture for a SourceModel it cannot build, from its config alone
    check_source: Callable[[Any], None] | None = None

    @property
    def needs_export(self) -> bool:
        return self.from_source is None

    def check(self, source: Any) -> None:
        """Refuse a source (a ``SourceModel``) this recipe cannot build, before its weights load."""
        if self.check_source is not None:
            self.check_source(source)

    def apply(self, export_model: Path | None, target: Path, source: Any) -> None:
        """Write ``target`` from the fp32 export or, for graph builders, from ``source`` (a
        ``SourceModel``)."""
        if self.from_source is not None:
            self.from_source(source, target)
        elif self.build is not None and export_model is not None:
            self.build(export_model, target)
        else:
            raise RecipeError(f"recipe {self.name!r} defines no build")


def untie_lm_head(model: Any) -> bool:
    """Give the LM head its own weight so weight-only quantizers can quantize it.

    Optimum exports a tied head as ``MatMul(hidden, Transpose(embedding))``; the quantizers only
    touch MatMuls with a constant weight, so the transposed embedding becomes a real initializer.
    Returns True when a head was untied.
    """
    from onnx import numpy_helper

    initializers = {init.name: init for init in model.graph.initializer}
    consumers: dict[str, list[Any]] = {}
    for node in model.graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    for node in list(model.graph.node):
        if node.op_type != "Transpose" or node.input[0] not in initializers:
            continue
        users = consumers.get(node.output[0], [])
        if not users or any(u.op_type != "MatMul" for u in users):
            continue
        weight = numpy_helper.to_array(initializers[node.input[0]])
        perm = next((list(a.ints) for a in node.attribute if a.name == "perm"), None)
        untied = np.ascontiguousarray(np.transpose(weight, perm))
        model.graph.initializer.append(numpy_helper.from_array(untied, "lm_head.weight.untied"))
        for user in users:
            for i, name in enumerate(user.input):
                if name == node.output[0]:
                    user.input[i] = "lm_head.weight.untied"
        model.graph.node.remove(node)
        return True
    return False


def lm_head_nodes(model: Any) -> list[str]:
    """Names of the MatMul nodes that produce the logits (the LM head)."""
    producers = {out: node for node in model.graph.node for out in node.output}
    node = producers.get("logits")
    return [node.name] if node is not None and node.op_type == "MatMul" else []


def quantize_nbits(
    model: Any,
    bits: int,
    *,
    quantize_head: bool,
    block_size: int = 32,
    accuracy_level: int = 4,
    keep_fp32: Callable[[str], bool] | None = None,
) -> Any:
    """MatMulNBits weights (symmetric; block 32 and accuracy_level 4 unless told otherwise) for
    an ``onnx.ModelProto``; MatMul nodes whose name ``keep_fp32`` accepts stay fp32.

    Returns the quantizer's ``ONNXModel`` (save it with ``save_model_to_file``).
    """
    from onnxruntime.quantization import QuantFormat
    from onnxruntime.quantization.matmul_nbits_quantizer import (
        DefaultWeightOnlyQuantConfig,
        MatMulNBitsQuantizer,
    )

    exclude: list[str] = []
    if quantize_head:
        untie_lm_head(model)
    else:
        exclude = lm_head_nodes(model)
    if keep_fp32 is not None:
        exclude += [n.name for n in model.graph.node if n.op_type == "MatMul" and keep_fp32(n.name)]
    config = DefaultWeightOnlyQuantConfig(
        block_size=block_size,
        is_symmetric=True,
        accuracy_level=accuracy_level,
        bits=bits,
        quant_format=QuantFormat.QOperator,
    )
    quantizer = MatMulNBitsQuantizer(
        model,
        bits=bits,
        block_size=block_size,
        is_symmetric=True,
        accuracy_level=accuracy_level,
        nodes_to_exclude=exclude,
        algo_config=config,
    )
    quantizer.process()
    return quantizer.model


def matmul_nbits(bits: int, *, quantize_head: bool) -> Callable[[Path, Path], None]:
    def build(source: Path, target: Path) -> None:
        import onnx

        model = quantize_nbits(onnx.load(str(source)), bits, quantize_head=quantize_head)
        model.save_model_to_file(str(target), use_external_data_format=False)

    return build


def optimum_dynamic_int8(source: Path, target: Path) -> None:
    """Optimum's dynamic int8 (per-tensor activations): kept for comparison, not as a default."""
    from optimum.onnxruntime import ORTQuantizer
    from optimum.onnxruntime.configuration import AutoQuantizationConfig

    config = (AutoQuantizationConfig.avx512_vnni if has_vnni() else AutoQuantizationConfig.avx2)(
        is_static=False, per_channel=False
    )
    work = target.parent / "_dynamic_int8"
    quantizer = ORTQuantizer.from_pretrained(str(source.parent), file_name=source.name)
    quantizer.quantize(save_dir=str(work), quantization_config=config)
    produced = next(work.glob("*.onnx"))
    shutil.move(str(produced), str(target))
    shutil.rmtree(work, ignore_errors=True)


def fused_graph(bits: int | None, attention: str = "ops") -> Callable[[Any, Path], None]:
    """Our own fused graph (``fused.py``) from the source's weights; MatMulNBits when ``bits``,
    each weight quantized as the graph is built (bit-identical to quantizing the fp32 graph
    with ``quantize_nbits`` afterwards, at a fraction of the memory); ``attention``: the
    builder's attention kind.

    Refuses architectures the builder does not cover (``UnsupportedArchitecture``) from the
    source's config before loading any weights; "auto" then moves on to Optimum recipes.
    """

    def build(source: Any, target: Path) -> None:
        fused_supported(source)
        weights = target.with_name(target.name + ".data")  # written as the graph is built
        model = fused.build_fused_model(
            source.model, bits=bits, weights=weights, tensors=source.tensors, attention=attention
        )
        fused.save_model(model, target)

    return build


def fused_integer(attention: str = "ops", quantizer: str = "ops") -> Callable[[Any, Path], None]:
    """The fused graph with exact integer matrix products (``fused._IntegerGraph``);
    ``attention`` and ``quantizer``: the builder's kinds (``build_fused_model``)."""

    def build(source: Any, target: Path) -> None:
        fused_supported(source)
        peaks = activation_peaks(source.model, source.tokenizer, tensors=source.tensors)
        weights = target.with_name(target.name + ".data")
        model = fused.build_fused_model(
            source.model,
            integer=GROUPED_WEIGHT_BITS if quantizer == "kernel" else INTEGER_WEIGHT_BITS,
            weights=weights,
            smoothing=Smoothing(peaks),
            outliers=INTEGER_OUTLIERS,
            # where our operators are used, GroupProduct computes every product
            blocks=() if quantizer == "kernel" else INTEGER_BLOCKS,
            grouped=INTEGER_GROUPED if quantizer == "kernel" else (),
            group=INTEGER_GROUP,
            tensors=source.tensors,
            kv_dtype=INTEGER_KV,
            value_dtype=INTEGER_VALUES if attention == "kernel" else None,
            attention=attention,
            quantizer=quantizer,
        )
        fused.save_model(model, target)

    return build


def fused_supported(source: Any) -> None:
    fused.check_supported(source.config)


def kernel_supported(source: Any) -> None:
    """The fused graph's check, and our operators built for this machine (``kernels``): a
    recipe that uses them is refused, saying why, where they cannot be compiled."""
    fused_supported(source)
    kernels.library()


def copy_fp32(source: Path, target: Path) -> None:
    """The fp32 export itself (hard-linked: no second copy on disk)."""
    try:
        target.hardlink_to(source)
    except OSError:
        shutil.copy2(source, target)


# int8 weights where MLAS multiplies them with VNNI (or AMX); 7-bit ones where it uses AVX2's
# vpmaddubsw, whose int16 pair sums would saturate with 8-bit weights (fused._IntegerGraph).
# fused-int8's; fused-int8-kernel's GroupProduct keeps 8-bit weights on every CPU.
INTEGER_WEIGHT_BITS = 8 if has_vnni() else 7
# GroupProduct's sums are exact for 8-bit weights on every CPU (VNNI or byte products)
GROUPED_WEIGHT_BITS = 8
# input channels kept apart from the others (in fp32), by calibrated peak (fused._IntegerGraph;
# bundled model: 8 -> 96.8% / 0.060, 16 -> 97.7% / 0.049, 32 -> 97.5% / 0.045, and each channel
# adds 4 bytes a weight row to every decode step)
INTEGER_OUTLIERS = 16
# products kept in fused-q8's 8-bit blocks: per-column scales lose most on the down projections
# (bundled model: top-1 95.7% -> 96.4%, mean |dlogprob| 0.082 -> 0.059, before the outlier
# channels went to fp32; fused._IntegerGraph)
INTEGER_BLOCKS = ("/down",)
# fused-int8-kernel computes every product as an integer product scaled per group of input
# channels, weights and rows alike (fused._IntegerGraph, ``grouped``; our GroupProduct
# operator). Bundled model: the down projections alone, as standard operators per group, 12
# groups of 128: top-1 97.2% / 0.054, 24 of 64: 97.5% / 0.050 (8-bit blocks: 97.1% / 0.050);
# GroupProduct for every product, 64 channels a group: 97.3% / 0.040 (16 outlier channels
# apart; 8: 97.6% / 0.045, 0: 96.4% / 0.057)
INTEGER_GROUP = 64
INTEGER_GROUPED = ("/qkv", "/o", "/gate_up", "/down", "lm_head")
# fused-int8's KV buffers: fp16 halves what attention reads a step and a row's memory (bundled
# model, graph_ab, 250 keys: 16-row step -17%, one-row step +3-5% for the casts) at no
# measurable cost in fidelity (97.7% / 0.049 -> 97.6% / 0.050); fused-q8 keeps fp32 (its top-1
# would go 96.2% -> 96.0%, under the default's bar; benchmarks/README.md)
INTEGER_KV = "float16"
# fused-int8-kernel's value buffers: int8, one fp32 scale per token and KV head (our
# KVAttentionInt8Values). Probed first (prepare's broad set, bundled model: each value head
# rounded to int8 and back as written): top-1 97.8% / mean |dlogprob| 0.0422 / KL 0.0024 against
# fp16's 97.5% / 0.0415 / 0.0024; the keys in int8 lost (97.1% / 0.0533), so they stay fp16.
# Built: 98.1% / 0.0423 / 0.0026. A column 196 bytes a KV head instead of 256 (bundled model): a
# row's KV 23% smaller, a 16-row step at 250 keys 6% faster (15% on Qwen3-0.6B's shape at 1,000
# keys; benchmarks/README.md, "fused-int8-kernel's values in int8")
INTEGER_VALUES = "int8"
# every fused graph's layout (the engine reads these)
_FUSED = {"graph": "fused", "kv": "scatter-in-place", "attention": "ops", "logits_to_keep": "input"}
_Q8_PARAMS = {**_FUSED, "bits": 8, "block_size": 32, "accuracy_level": 4, "lm_head": "q8"}
_INT8_PARAMS = {
    **_FUSED,
    "bits": 8,
    "weights": "int8, one scale per output column",
    "weight_bits": INTEGER_WEIGHT_BITS,
    "activations": "uint8, one scale per row, computed at run time",
    "smoothing": "SmoothQuant alpha 0.5, calibration set v1",
    "outlier_channels": f"{INTEGER_OUTLIERS}, fp32",
    "8-bit blocks": list(INTEGER_BLOCKS),
    "lm_head": "int8",
    "kv_dtype": INTEGER_KV,
}
# what the fused builder covers (nbresponses.models.architectures); others: UnsupportedArchitecture
_FAMILIES = "Llama 3.x, Mistral, Qwen2/3, SmolLM3, Gemma 3 and Phi-3/4 decoders"
RECIPES: dict[str, Recipe] = {
    r.name: r
    for r in (
        Recipe("fp32", "the fp32 ONNX export, unquantized (the fidelity reference)", copy_fp32),
        Recipe(
            "q8",
            "MatMulNBits 8-bit weights, block 32, accuracy_level 4 (int8 VNNI kernels), "
            "LM head untied and quantized",
            matmul_nbits(8, quantize_head=True),
            {"bits": 8, "block_size": 32, "accuracy_level": 4, "lm_head": "q8"},
        ),
        Recipe(
            "q8-fp32-head",
            "MatMulNBits 8-bit weights as q8, LM head left fp32 (higher fidelity, slower head)",
            matmul_nbits(8, quantize_head=False),
            {"bits": 8, "block_size": 32, "accuracy_level": 4, "lm_head": "fp32"},
        ),
        Recipe(
            "q4",
            "MatMulNBits 4-bit weights, block 32, accuracy_level 4, LM head quantized "
            "(smallest and fastest, low fidelity on small models)",
            matmul_nbits(4, quantize_head=True),
            {"bits": 4, "block_size": 32, "accuracy_level": 4, "lm_head": "q4"},
        ),
        Recipe(
            "dynamic-int8",
            "Optimum AutoQuantizationConfig.avx512_vnni (avx2 without VNNI), dynamic int8 with "
            "per-tensor activation scales; for comparison only",
            optimum_dynamic_int8,
            # one activation scale per tensor: a token's numbers depend on every token of its
            # run, so a prefix hit (a shorter run) would change them: no prefix reuse
            {
                "optimum": "avx512_vnni" if has_vnni() else "avx2",
                "is_static": False,
                "prefix_reuse": False,
            },
        ),
        Recipe(
            "fused-fp32",
            "our fused graph (standard-op attention, SkipSimplifiedLayerNormalization, packed "
            "QKV and gate/up) built from the source weights, fp32; " + _FAMILIES,
            params={
                **_FUSED,
                "bits": 32,
            },
            from_source=fused_graph(None),
            check_source=fused_supported,
        ),
        Recipe(
            "fused-q8",
            "the fused graph with MatMulNBits 8-bit weights, block 32, accuracy_level 4, "
            "LM head quantized (about 2x the decode speed of q8); " + _FAMILIES,
            params=_Q8_PARAMS,
            from_source=fused_graph(8),
            check_source=fused_supported,
        ),
        Recipe(
            "fused-q4",
            "the fused graph with MatMulNBits 4-bit weights, block 32, accuracy_level 4, "
            "LM head quantized (fastest, low fidelity on small models); " + _FAMILIES,
            params={
                **_FUSED,
                "bits": 4,
                "block_size": 32,
                "accuracy_level": 4,
                "lm_head": "q4",
            },
            from_source=fused_graph(4),
            check_source=fused_supported,
        ),
        Recipe(
            "fused-int8",
            "the fused graph with exact integer matrix products (int8 weights per output "
            "column, activations per row at run time, SmoothQuant; MLAS's VNNI/AMX GEMM) but "
            "the MLP's down projections in fused-q8's 8-bit blocks, 16 outlier channels in "
            "fp32 and the KV cache in fp16: faster prompts, scoring and batches than fused-q8, "
            "slower batch-1 decode, closer to fp32; " + _FAMILIES,
            params=_INT8_PARAMS,
            from_source=fused_integer(),
            check_source=fused_supported,
        ),
        Recipe(
            "fused-q8-kernel",
            "fused-q8 with its attention computed by our KVAttention operator (compiled on "
            "first use: a C++ compiler and ONNX Runtime's headers, `make kernel-deps`): each "
            "token reads only its own KV columns, faster steps and prompts, the same exactness; "
            + _FAMILIES,
            params={
                **_Q8_PARAMS,
                "attention": "kernel",
                "operator": kernels.source_digest(),
            },
            from_source=fused_graph(8, attention="kernel"),
            check_source=kernel_supported,
        ),
        Recipe(
            "fused-int8-kernel",
            "fused-int8 with its attention computed by our KVAttention operator (as "
            "fused-q8-kernel), reading the KV as stored (keys fp16, values int8 with a scale "
            "per token and head), and every product (QKV, o, "
            "gate/up, down, LM head) an integer product of weights and rows each scaled per 64 "
            "input channels by our GroupProduct operator (VNNI, or AVX2), 16 outlier channels "
            "in fp32; " + _FAMILIES,
            params={
                **_INT8_PARAMS,
                "weight_bits": GROUPED_WEIGHT_BITS,
                "attention": "kernel",
                "quantizer": "kernel",
                "weights": "int8, one scale per 64 input channels and output column",
                "activations": "int8, one scale per 64 channels of a row, computed at run time",
                "8-bit blocks": [],
                "grouped": {"products": list(INTEGER_GROUPED), "channels": INTEGER_GROUP},
                "value_dtype": INTEGER_VALUES,
                "operator": kernels.source_digest(),
            },
            from_source=fused_integer(attention="kernel", quantizer="kernel"),
            check_source=kernel_supported,
        ),
    )
}

# "auto" tries these in order (fastest first) and keeps the first whose fidelity holds.
# fused-q8: the same weights as q8 in our fused graph, about 1.7-2x q8's batch-1 decode and 2.5x
# at 16 concurrent; models the fused builder does not cover skip the fused recipes
# (UnsupportedArchitecture) and get the Optimum recipes. Before it, wherever our operators can
# be had (a compiler and ONNX Runtime's headers, `make kernel-deps`, or a library this machine
# built already), fused-int8-kernel: on the bundled model, with VNNI, 1.4x fused-q8's decode for
# one request, 2.5x for 16, two thirds of its time to first token (`decode.py`, both in one run,
# December 2026); without VNNI (GroupProduct's byte products; MLAS shown the older CPU by
# benchmarks/cpu_without.py) 1.47x / 2.20x / 2.06x for one request / 16 / scoring on AVX-512,
# 1.50-1.56x / 1.82-1.84x / 1.61-1.66x on AVX2; and more faithful: top-1 98.1% / mean |dlogprob|
# 0.042 against 96.2% / 0.059 (on AVX2 97.5% / 0.041 against 96.7% / 0.058), every product
# scaled per 64 channels (benchmarks/README.md, "Every product scaled per 64 channels:
# GroupProduct", "GroupProduct without VNNI"). Where the operators cannot be built (Binder's
# image has no ONNX Runtime headers) fused-q8 stays first.
_BASE_ORDER = ("fused-q8", "q8", "q8-fp32-head", "fp32")


def auto_order(operators: bool) -> tuple[str, ...]:
    """What "auto" tries where our ``operators`` can (or cannot) be built."""
    return ("fused-int8-kernel", *_BASE_ORDER) if operators else _BASE_ORDER


AUTO_ORDER = auto_order(kernels.buildable())
AUTO = "auto"
# "analysis": logprobs as close to fp32 as this machine runs them, for people who study them.
# 8-bit weights with fp32 activations (accuracy_level 0) measure 98.0% top-1 and |Δ logprob|
# 0.035 on the bundled model, and decode at 7 tok/s in ONNX Runtime 1.32 (docs/concepts/
# models.md has the table): only fp32 weights meet the 99.5% / 0.01 goal, so the analysis
# recipe is the fused fp32 graph (the Optimum fp32 export for models it does not cover).
ANALYSIS_ORDER = ("fused-fp32", "fp32")
ANALYSIS = "analysis"
ALIASES = {AUTO: AUTO_ORDER, ANALYSIS: ANALYSIS_ORDER}
# Top-1 agreement with fp32 on the broad fidelity set. 8-bit VNNI recipes measure 96.3% there
# on the bundled model (95% CI 95.3-97.1%; llama.cpp Q8_0 agrees ~96% on held-out chat too),
# 4-bit ones about 65%: the bar sits between them.
FIDELITY_BAR = 0.95


def get_recipe(name: str) -> Recipe:
    try:
        return RECIPES[name]
    except KeyError:
        raise RecipeError(
            f"Unknown quantization recipe {name!r}. Accepted: {AUTO!r} (default: the fastest "
            f"recipe with >= {FIDELITY_BAR:.0%} top-1 agreement), {ANALYSIS!r} (fp32 weights: "
            "logprobs for analysis), " + ", ".join(map(repr, RECIPES))
        ) from None
