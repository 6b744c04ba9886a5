"""The fused graph for each decoder family it covers, on tiny random-weight models.

For every architecture of ``helpers.tiny_archs``: the fused fp32 graph gives PyTorch's logits
(within fp32 rounding) on a prompt set, prefill and a decode loop with past, positions well past
Gemma 3's sliding window included, and the same greedy tokens, with and without smoothing; the
8-bit graphs (``fused-q8``'s MatMulNBits, ``fused-int8``'s integer products) run in the engine,
and each request's tokens and logprobs are bit-identical alone and batched. What the builder
cannot do it refuses, naming the reason.
"""

from __future__ import annotations

import functools
from collections import Counter

import numpy as np
import onnx
import pytest
from helpers.engine import alone_then_batched
from helpers.tiny_archs import (
    ARCHITECTURES,
    SLIDING_WINDOW,
    build_tiny_model,
    prepare_tiny,
    save_tiny_model,
)

from nbresponses.models import architectures, kernels
from nbresponses.models.fused import (
    MAX_POSITIONS,
    UnsupportedArchitecture,
    build_fused_model,
    check_supported,
)
from nbresponses.models.smoothing import Smoothing, activation_peaks
from nbresponses.runtime.generator import TokenGenerator
from nbresponses.tokens.contract import SamplingParams

NAMES = list(ARCHITECTURES)
DECODE_STEPS = 12
RELATIVE = 1e-4  # of the largest |logit|: fp32 rounding in another summation order


def _session(model: onnx.ModelProto):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    if any(node.domain == kernels.DOMAIN for node in model.graph.node):
        kernels.register(options)
    return ort.InferenceSession(
        model.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )


@functools.cache
def _torch_model(name: str, vocab_size: int, special: tuple[tuple[str, int], ...]):
    return build_tiny_model(name, vocab_size, special_ids=dict(special))


@pytest.fixture(scope="module", params=NAMES)
def arch(request, tokenizer):
    """(name, PyTorch model, fused fp32 ModelProto) of one architecture."""
    special = (("eos_token_id", tokenizer.eos_token_id), ("pad_token_id", tokenizer.pad_token_id))
    model = _torch_model(request.param, len(tokenizer), special)
    return request.param, model, build_fused_model(model)


PAST_ROOM = 96  # the ops graph writes each new key in place: its past buffers need room


def _empty_past(session) -> dict[str, np.ndarray]:
    return {
        i.name: np.zeros(
            (1, i.shape[1], PAST_ROOM, i.shape[3]),
            np.float16 if i.type == "tensor(float16)" else np.float32,
        )
        for i in session.get_inputs()
        if i.name.startswith("past_key_values")
    }


def _step(session, ids: list[int], start: int, past: dict[str, np.ndarray]):
    """Run ``ids`` at positions ``start..``; returns (logits [len, V], the next past)."""
    names = [o.name for o in session.get_outputs()]
    feeds = {
        "input_ids": np.asarray([ids], np.int64),
        "position_ids": np.arange(start, start + len(ids), dtype=np.int64)[None],
        "num_logits_to_keep": np.zeros(1, np.int64),
        **past,
    }
    assert start + len(ids) <= PAST_ROOM
    out = dict(zip(names, session.run(names, feeds), strict=True))
    return out["logits"][0], {
        n.replace("present.", "past_key_values."): v for n, v in out.items() if n != "logits"
    }


def _torch_logits(model, ids: list[int]) -> np.ndarray:
    import torch

    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].float().numpy()


def test_the_prompts_run_past_the_sliding_window(prompts) -> None:
    assert min(len(p) for p in prompts) > 3 * SLIDING_WINDOW


@pytest.mark.slow
def test_fp32_graph_equals_pytorch_prefill_and_decode(arch, prompts) -> None:
    """Prefill logits, then a greedy decode loop fed its own past: PyTorch's logits at every
    position within 1e-4 of their scale, and PyTorch's greedy tokens (four prompts of 31 to
    49 tokens: the shortest, two between, the longest)."""
    name, model, graph = arch
    session = _session(graph)
    worst = 0.0
    for prompt in [*sorted(prompts, key=len)[::2], max(prompts, key=len)]:
        logits, past = _step(session, prompt, 0, _empty_past(session))
        generated, decoded = [], [logits[-1]]
        for _ in range(DECODE_STEPS - 1):
            generated.append(int(np.argmax(decoded[-1])))
            step, past = _step(session, generated[-1:], len(prompt) + len(generated) - 1, past)
            decoded.append(step[-1])
        generated.append(int(np.argmax(decoded[-1])))
        reference = _torch_logits(model, prompt + generated)[:-1]  # each token's logits
        ours = np.concatenate([logits[:-1], np.stack(decoded)])
        scale = np.abs(reference).max()
        worst = max(worst, np.abs(ours - reference).max() / scale)
        assert np.abs(ours - reference).max() <= RELATIVE * scale, (name, len(prompt))
        # PyTorch's argmax after each prefix of our tokens: our greedy tokens are PyTorch's
        assert generated == reference[len(prompt) - 1 :].argmax(-1).tolist(), name
    assert worst > 0  # another kernel's summation order: equal to rounding, not identical


def test_yarn_rope_scaling_equals_pytorch(prompts, tokenizer) -> None:
    """Qwen3's long-context setting (yarn): a fixed function of the position, like llama3's."""
    yarn = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 128}
    model = build_tiny_model("qwen3", len(tokenizer), rope_scaling=yarn)
    session = _session(build_fused_model(model))
    prompt = max(prompts, key=len)
    logits, _ = _step(session, prompt, 0, _empty_past(session))
    reference = _torch_logits(model, prompt)
    assert np.abs(logits - reference).max() <= RELATIVE * np.abs(reference).max()


def test_a_float16_kv_is_stored_rounded_and_read_the_same_in_every_step_shape(
    arch, prompts
) -> None:
    """``kv_dtype="float16"`` (fused-int8's KV): the buffers are float16 and the first layer's
    hold the fp32 graph's keys and values rounded once (later layers' inputs already differ); a
    prompt's logits are the same bits whether its
    last tokens come in its prefill run or one decode step each (every step reads the stored,
    rounded keys, its own included), and within fp16 rounding of the fp32-KV graph's."""
    name, model, graph = arch
    half = _session(build_fused_model(model, kv_dtype="float16"))
    pasts = [i for i in half.get_inputs() if i.name.startswith("past_key_values")]
    assert pasts and {i.type for i in pasts} == {"tensor(float16)"}
    prompt = max(prompts, key=len)
    whole, past = _step(half, prompt, 0, _empty_past(half))
    reference, reference_past = _step(_session(graph), prompt, 0, _empty_past(_session(graph)))
    assert {v.dtype for v in past.values()} == {np.dtype(np.float16)}
    for kind in ("key", "value"):  # the prompt's columns of layer 0: fp32's, rounded once
        stored = past[f"past_key_values.0.{kind}"][:, :, : len(prompt)]
        exact = reference_past[f"past_key_values.0.{kind}"][:, :, : len(prompt)]
        np.testing.assert_array_equal(stored, exact.astype(np.float16))
    head, past = _step(half, prompt[:-4], 0, _empty_past(half))
    steps = [head[-1]]
    for i in range(len(prompt) - 4, len(prompt)):
        logits, past = _step(half, prompt[i : i + 1], i, past)
        steps.append(logits[-1])
    np.testing.assert_array_equal(np.stack(steps[:-1]), whole[-5:-1])
    np.testing.assert_array_equal(steps[-1], whole[-1])
    scale = np.abs(reference).max()
    difference = np.abs(whole - reference).max()
    # measured 0.08-1.0% of the scale on these random models (fp16's 2^-11 steps, amplified
    # through their layers); the real model's fidelity: docs/concepts/models.md
    assert 0 < difference <= 2e-2 * scale, (name, difference / scale)


def test_a_float16_kv_saturates_instead_of_overflowing(prompts, tokenizer) -> None:
    """Keys past float16's range are stored as its largest finite value, not inf (which would
    turn every later score of the row into NaN)."""
    import torch

    model = build_tiny_model("llama3", len(tokenizer))
    with torch.no_grad():
        model.model.layers[0].self_attn.k_proj.weight.mul_(1e6)
    session = _session(build_fused_model(model, kv_dtype="float16"))
    prompt = prompts[0]
    logits, past = _step(session, prompt, 0, _empty_past(session))
    keys = past["past_key_values.0.key"][:, :, : len(prompt)].astype(np.float32)
    assert np.isfinite(keys).all() and np.abs(keys).max() == np.finfo(np.float16).max
    assert np.isfinite(logits).all()


def test_a_float16_kv_needs_the_ops_attention() -> None:
    """A float16 KV needs attention that writes in place; int8 values our operator."""
    model = _torch_model("llama3", 64, ())
    with pytest.raises(ValueError, match="kv_dtype"):
        build_fused_model(model, attention="gqa", kv_dtype="float16")
    with pytest.raises(ValueError, match="kv_dtype"):
        build_fused_model(model, kv_dtype="int8")
    # int8 values are our KVAttentionInt8Values' only
    for attention, kv_dtype in (("ops", "float16"), ("gqa", "float32")):
        with pytest.raises(ValueError, match="value_dtype"):
            build_fused_model(model, attention=attention, kv_dtype=kv_dtype, value_dtype="int8")
    with pytest.raises(ValueError, match="value_dtype"):
        build_fused_model(model, attention="kernel", kv_dtype="float16", value_dtype="int4")


def test_ops_attention_layers(arch) -> None:
    """The shipped graph: no GroupQueryAttention; rotary on the layers that have it (q and k),
    each windowed layer masked by its window's bias, every layer's KV written in place."""
    name, model, graph = arch
    config = model.config
    layers = config.num_hidden_layers
    ops = Counter(n.op_type for n in graph.graph.node)
    assert ops["GroupQueryAttention"] == 0
    assert ops["ScatterND"] == 2 * layers
    rotated = [r is not None for r in architectures.layer_rotary(config)]
    assert ops["RotaryEmbedding"] == 2 * sum(rotated)
    by_name = {n.name: n for n in graph.graph.node}
    for i, window in enumerate(architectures.layer_windows(config)):
        assert (f"layers.{i}/q_rotary" in by_name) is rotated[i]
        bias = by_name[f"layers.{i}/attn/mask"].input[1]
        assert bias.startswith(f"attn/window{window}/" if window else "attn/bias/"), (i, bias)
    if name == "gemma3":
        assert [w or None for w in architectures.layer_windows(config)] == [
            SLIDING_WINDOW,
            None,
            SLIDING_WINDOW,
        ]


def test_graph_is_fused(arch) -> None:
    """GroupQueryAttention graphs (``attention="gqa"``, kept for comparison): attention in one
    kernel per layer and nothing unfused left; the family's extras only."""
    name, model, _ = arch
    graph = build_fused_model(model, attention="gqa")
    config = model.config
    layers = config.num_hidden_layers
    ops = Counter(n.op_type for n in graph.graph.node)
    assert ops["GroupQueryAttention"] == layers
    assert ops["MatMul"] == 4 * layers + 1  # packed qkv, o, packed gate/up, down; the LM head
    assert not {"Softmax", "Transpose", "Pow", "ReduceMean", "Sin", "Cos", "Where"} & set(ops)
    spec = architectures.ARCHITECTURES[config.model_type]
    norms = ops["SimplifiedLayerNormalization"] + ops["SkipSimplifiedLayerNormalization"]
    assert norms == 1 + 2 * layers + (2 * layers if spec.sandwich_norms else 0) + (
        2 * layers if spec.qk_norm else 0
    )
    attention = [n for n in graph.graph.node if n.op_type == "GroupQueryAttention"]
    rotary = [next(a.i for a in n.attribute if a.name == "do_rotary") for n in attention]
    windows = [next(a.i for a in n.attribute if a.name == "local_window_size") for n in attention]
    assert rotary == [int(r is not None) for r in architectures.layer_rotary(config)]
    assert windows == [w or -1 for w in architectures.layer_windows(config)]
    if name == "smollm3":
        assert rotary == [1, 0, 1]
    if name == "mistral":
        assert windows == [SLIDING_WINDOW] * layers
    if name == "gemma3":
        assert windows == [SLIDING_WINDOW, -1, SLIDING_WINDOW]
        assert ops["Tanh"] == 1  # the final logit softcap


def test_long_rope_stops_at_the_original_context(arch) -> None:
    """Phi-3.5 / Phi-4-mini: the graph covers the positions where its long-rope is exact (the
    short factors), and says so; the others cover their whole context."""
    _, model, graph = arch
    config = model.config
    positions = int(dict((p.key, p.value) for p in graph.metadata_props)[MAX_POSITIONS])
    if architectures.rope_type(config) == "longrope":
        assert positions == config.original_max_position_embeddings < config.max_position_embeddings
    else:
        assert positions == config.max_position_embeddings


def _integer_graph(model, tokenizer, quantizer: str = "ops", *, grouped: bool = False):
    """The ``fused-int8`` recipe's graph: smoothing calibrated on the model, outliers apart,
    the down projections in 8-bit blocks (``quantizer="kernel"``: ``fused-int8-kernel``'s
    row quantizer; ``grouped``: its products, our GroupProduct)."""
    from nbresponses.models.recipes import (
        INTEGER_BLOCKS,
        INTEGER_GROUP,
        INTEGER_GROUPED,
        INTEGER_KV,
        INTEGER_OUTLIERS,
        INTEGER_WEIGHT_BITS,
    )

    smoothing = Smoothing(activation_peaks(model, tokenizer))
    return build_fused_model(
        model,
        integer=INTEGER_WEIGHT_BITS,
        smoothing=smoothing,
        outliers=INTEGER_OUTLIERS,
        blocks=() if grouped else INTEGER_BLOCKS,
        grouped=INTEGER_GROUPED if grouped else (),
        group=INTEGER_GROUP,
        kv_dtype=INTEGER_KV,
        quantizer=quantizer,
    )


def test_the_integer_graph_shares_its_rows_zero_points(arch, tokenizer) -> None:
    """Every row quantization reads one of two zero-point tensors made once per run (the layers'
    rows and the LM head's kept rows), not one each; the outlier channels are fp32 products."""
    name, model, _ = arch
    nodes = _integer_graph(model, tokenizer).graph.node
    zero_points = [n.output[0] for n in nodes if n.name.endswith("rows_zero_points")]
    assert len(zero_points) == 2, name
    quantizers = [n for n in nodes if n.op_type == "QuantizeLinear"]
    assert quantizers and all(n.input[2] in zero_points for n in quantizers), name
    outliers = [n for n in nodes if n.name.endswith("_outliers")]
    assert outliers and {n.op_type for n in outliers} == {"MatMul"}, name


def test_our_quantizer_gives_the_integer_graph_the_same_bits(arch, prompts, tokenizer) -> None:
    """``QuantizeRows`` and ``OutlierProduct`` in place of the standard operators (a mask,
    Gather, Abs, ReduceMax, Mul and QuantizeLinear a product; the outliers' MatMul and Add):
    one node each, and the same logits bit for bit, a prompt's prefill and one-token steps
    after it (QuantizeRows gives those operators' bits by construction, tests/models/
    test_kernel_integer.py; OutlierProduct's fixed fma chain measured the same bits as MLAS's
    SGEMM at K = 16)."""
    name, model, _ = arch
    try:
        kernels.library()
    except kernels.KernelsUnavailable as error:
        pytest.skip(str(error))
    ops, ours = (_integer_graph(model, tokenizer, q) for q in ("ops", "kernel"))
    kinds = Counter(n.op_type for n in ours.graph.node)
    assert not {"QuantizeLinear", "Abs", "ReduceMax"} & set(kinds), name
    assert kinds["QuantizeRows"] == kinds["MatMulIntegerToFloat"] > 0, name
    assert kinds["OutlierProduct"] > 0 and len(ours.graph.node) < len(ops.graph.node), name
    prompt = max(prompts, key=len)
    logits = []
    for graph in (ops, ours):
        session = _session(graph)
        out, past = _step(session, prompt, 0, _empty_past(session))
        steps = [out]
        for i, token in enumerate((5, 9, 2)):
            out, past = _step(session, [token], len(prompt) + i, past)
            steps.append(out)
        logits.append(np.concatenate(steps))
    assert np.array_equal(logits[0], logits[1]), name


def test_grouped_products_keep_the_function_and_the_bits(arch, prompts, tokenizer) -> None:
    """``fused-int8-kernel``'s products as our GroupProduct (a scale per 64 input channels):
    one node a product where the input's width divides (else 8-bit blocks), logits near the
    fp32 graph's (as near as the per-row products'), and a prompt's prefill the very bits of
    the same tokens as one-token steps."""
    name, model, plain = arch
    try:
        kernels.library()
    except kernels.KernelsUnavailable as error:
        pytest.skip(str(error))
    ours = _integer_graph(model, tokenizer, "kernel", grouped=True)
    kinds = Counter(n.op_type for n in ours.graph.node)
    assert kinds["GroupProduct"] > 0, name
    assert kinds["GroupProduct"] + kinds["MatMulNBits"] == 4 * model.config.num_hidden_layers + 1
    for node in ours.graph.node:
        if node.op_type == "MatMulNBits":  # only where the groups do not divide the width
            assert next(a.i for a in node.attribute if a.name == "K") % 64 != 0, name
    assert not {"MatMulIntegerToFloat", "QuantizeRows", "OutlierProduct"} & set(kinds), name
    tokens = [*max(prompts, key=len), 5, 9, 2]
    session = _session(ours)
    whole, _ = _step(session, tokens, 0, _empty_past(session))
    past = _empty_past(session)
    steps = []
    for i, token in enumerate(tokens):
        out, past = _step(session, [token], i, past)
        steps.append(out)
    assert np.array_equal(np.concatenate(steps), whole), name
    fp32 = _session(plain)
    reference, _ = _step(fp32, tokens, 0, _empty_past(fp32))
    blocks, _ = _step(
        _session(_integer_graph(model, tokenizer, "kernel")), tokens, 0, _empty_past(session)
    )
    ours_error = np.abs(whole - reference).mean()
    assert ours_error <= 1.5 * np.abs(blocks - reference).mean() + 1e-6, name


@pytest.mark.slow
def test_smoothing_keeps_the_function(arch, prompts, tokenizer) -> None:
    """Smoothing folded into the fp32 graph (norms' weights divided, the next weights' rows
    multiplied) changes the weights but not the model: PyTorch's logits within fp32 rounding."""
    name, model, plain = arch
    smoothing = Smoothing(activation_peaks(model, tokenizer))
    graph = build_fused_model(model, smoothing=smoothing)
    weights = {i.name: onnx.numpy_helper.to_array(i) for i in plain.graph.initializer}
    changed = [
        i.name
        for i in graph.graph.initializer
        if i.name.endswith("input_norm")
        and not np.allclose(onnx.numpy_helper.to_array(i), weights[i.name])
    ]
    assert len(changed) == model.config.num_hidden_layers, name  # every QKV input smoothed
    session = _session(graph)
    prompt = max(prompts, key=len)
    logits, _ = _step(session, prompt, 0, _empty_past(session))
    reference = _torch_logits(model, prompt)
    assert np.abs(logits - reference).max() <= RELATIVE * np.abs(reference).max(), name


@pytest.mark.parametrize("recipe", ["fused-q8", pytest.param("fused-int8", marks=pytest.mark.slow)])
async def test_in_the_engine_batched_equals_alone(
    arch, prompts, tokenizer, tmp_path, recipe
) -> None:
    """The quantized graphs in the engine: every request's tokens and logprobs (top 2 too)
    bit-identical alone and batched with requests of other lengths, joining at other steps;
    on the integer recipe, a text scored in prefill runs gets the decode steps' very bits."""
    name, model, _ = arch
    if recipe == "fused-q8":
        graph = build_fused_model(model)  # the quantizer changes the proto in place
        kernel = "MatMulNBits"
    else:
        graph = _integer_graph(model, tokenizer)
        kernel = "MatMulIntegerToFloat"
    prepared = prepare_tiny(model, graph, tmp_path / name, tokenizer, recipe)
    assert any(n.op_type == kernel for n in onnx.load(str(prepared.onnx_path)).graph.node)
    params = SamplingParams(max_tokens=10, temperature=0, logprobs=True, top_logprobs=2)
    async with TokenGenerator(prepared, tokenizer=tokenizer, prefix_cache_bytes=0) as engine:
        assert engine.runner.kv_in_place
        alone, batched = await alone_then_batched(engine, prompts, params)
    assert all(steps[0].logprobs for steps in alone)
    assert batched == alone * 2, name
    if recipe == "fused-int8":
        await _prefill_scores_equal_decode(prepared, tokenizer, prompts[0])


async def _prefill_scores_equal_decode(prepared, tokenizer, ids: list[int]) -> None:
    from nbresponses.engine import Engine

    text = tokenizer.decode(ids[1:40])
    generator = TokenGenerator(prepared, tokenizer=tokenizer, prefix_cache_bytes=0)
    async with Engine(generator, store_path="memory") as engine:
        by_prefill = await engine.score(text, top_logprobs=2, method="prefill")
        by_decode = await engine.score(text, top_logprobs=2, method="decode")
    first = by_prefill.output[0].content[0].logprobs
    assert len(first) > 20
    assert first == by_decode.output[0].content[0].logprobs


async def test_engine_context_stops_where_the_rotary_tables_do(tokenizer, tmp_path) -> None:
    model = build_tiny_model("phi3", len(tokenizer), special_ids={"pad_token_id": 0})
    prepared = prepare_tiny(
        model, build_fused_model(model), tmp_path / "phi3", tokenizer, "fused-fp32"
    )
    assert prepared.context_length == model.config.max_position_embeddings
    async with TokenGenerator(prepared, tokenizer=tokenizer) as engine:
        assert engine.context_length == model.config.original_max_position_embeddings


@pytest.mark.slow
def test_a_family_through_the_fused_recipe(tokenizer_dir, tmp_path, monkeypatch) -> None:
    """Gemma 3 end to end: Optimum exports it, the recipe builds the fused graph from the saved
    folder, and it agrees with the export on every scored token (one fidelity sample: fast)."""
    from nbresponses.models import fidelity, prepare
    from nbresponses.models.prepare import prepare_model

    quick = functools.partial(
        fidelity.measure_fidelity, samples=fidelity.FIDELITY_SET[:1], greedy_tokens=8
    )
    monkeypatch.setattr(prepare, "measure_fidelity", quick)
    source = save_tiny_model("gemma3", tmp_path / "gemma3-src", tokenizer_dir)
    prepared = prepare_model(source, "fused-fp32", cache_dir=tmp_path / "cache", progress=False)
    assert prepared.fidelity["top1_agreement"] == 1.0
    assert prepared.fidelity["max_abs_dlogprob"] < 1e-3


def _config(name: str, **changes):
    config = ARCHITECTURES[name](1000)
    for key, value in changes.items():
        setattr(config, key, value)
    return config


@pytest.mark.parametrize(
    ("config", "reason"),
    [
        (
            lambda: _config("phi4-mini", partial_rotary_factor=0.375),
            r"partial rotary of 24 of 64.*16",
        ),
        (lambda: _config("qwen3", attention_bias=True), "attention_bias"),
        (lambda: _config("gemma3", use_bidirectional_attention=True), "bidirectional"),
        (lambda: _config("gemma3", hidden_activation="gelu"), "hidden_activation 'gelu'"),
        (
            lambda: _config("llama3", rope_scaling={"rope_type": "dynamic", "factor": 2.0}),
            "rope_scaling 'dynamic'",
        ),
    ],
)
def test_what_the_builder_cannot_do_is_refused_with_the_reason(config, reason) -> None:
    with pytest.raises(UnsupportedArchitecture, match=reason):
        check_supported(config())


def test_weights_the_builder_would_not_read_are_refused() -> None:
    """A tripwire for what the configs do not say: no weight is dropped silently."""
    import torch

    model = build_tiny_model("llama3", 1000)
    model.model.layers[0].self_attn.o_proj.bias = torch.nn.Parameter(torch.zeros(64))
    with pytest.raises(UnsupportedArchitecture, match=r"o_proj\.bias"):
        build_fused_model(model)


@pytest.mark.parametrize("name", NAMES)
def test_every_family_is_supported(name) -> None:
    check_supported(ARCHITECTURES[name](1000))
