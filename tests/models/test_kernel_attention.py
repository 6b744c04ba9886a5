"""Our ``KVAttention`` operator (``nbresponses.models.kernels``) in the fused graph
(``attention="kernel"``), on the tiny model of every family the builder covers.

Its contract is the ops attention's (docs/concepts/determinism.md): a token's numbers do not
depend on its step's length, its batch-mates or the buffer's width; here that holds by
construction (one thread computes a token from its own columns in a fixed order), and these
tests check it bit for bit. Against the ops graph and PyTorch it may differ by fp32 rounding
only (another summation order).
"""

from __future__ import annotations

import functools
from collections.abc import Iterator

import numpy as np
import onnx
import pytest
from helpers.engine import alone_then_batched
from helpers.tiny_archs import ARCHITECTURES, build_tiny_model, prepare_tiny

from nbresponses.models import architectures, kernels
from nbresponses.models.fused import build_fused_model, save_model
from nbresponses.runtime.generator import TokenGenerator
from nbresponses.runtime.kv import KVBuffer
from nbresponses.tokens.contract import SamplingParams

# of the largest |logit|: fp32 rounding in another summation order (the bound the fused graph
# keeps against PyTorch; measured up to 1.6e-5, Phi-4-mini's shape with the AVX2 code); with an
# fp16 KV a later layer's key that differs in its last fp32 bits can round to the next float16
# (2^-11 apart): measured 3e-5 (Mistral)
RELATIVE = {"float32": 1e-4, "float16": 1e-3}
ROOM = 96
# the KV buffers a graph can have: (kv_dtype, value_dtype) of build_fused_model; "int8 values"
# (fused-int8-kernel's): keys fp16, values int8 with a scale per token and head
KV = {
    "float32": ("float32", None),
    "float16": ("float16", None),
    "int8 values": ("float16", "int8"),
}


# the operator's code for each instruction set this CPU runs: AVX-512 where it has it, and the
# AVX2 code (another reduction of each score, the library's exp) on every CPU
ISAS = {"native": (), "avx2": ("-mno-avx512f",)}


def _session(model: onnx.ModelProto, flags: tuple[str, ...] = ()):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    kernels.register(options, flags)
    return ort.InferenceSession(
        model.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )


@functools.cache
def _models(name: str, vocab_size: int, kv: str, isa: str = "native"):
    """The tiny model, its ops graph's session (fp16 KV when ``kv`` stores values in int8: the
    nearest graph without them), our operator's graph's session and that graph."""
    kv_dtype, value_dtype = KV[kv]
    model = build_tiny_model(name, vocab_size)
    ops = build_fused_model(model, kv_dtype=kv_dtype)
    kernel = build_fused_model(
        model, attention="kernel", kv_dtype=kv_dtype, value_dtype=value_dtype
    )
    return model, _session(ops), _session(kernel, ISAS[isa]), kernel


def _past(session, rows: int = 1, room: int = ROOM) -> dict[str, np.ndarray]:
    return {
        i.name: KVBuffer.of_input(i).zeros(room, rows)
        for i in session.get_inputs()
        if i.name.startswith("past_key_values")
    }


def _run(session, ids: np.ndarray, positions: np.ndarray, past: dict[str, np.ndarray]):
    """One run of [B, S] ``ids`` at ``positions``; returns (logits [B, S, V], the next past)."""
    names = [o.name for o in session.get_outputs()]
    feeds = {
        "input_ids": ids,
        "position_ids": positions,
        "num_logits_to_keep": np.zeros(1, np.int64),
        **past,
    }
    out = dict(zip(names, session.run(names, feeds), strict=True))
    return out["logits"], {
        n.replace("present.", "past_key_values."): v for n, v in out.items() if n != "logits"
    }


def _prefill(session, prompt: list[int], room: int = ROOM):
    ids = np.asarray([prompt], np.int64)
    return _run(session, ids, np.arange(len(prompt))[None], _past(session, room=room))


@pytest.fixture(scope="module", params=list(ARCHITECTURES))
def family(request) -> Iterator[str]:
    """One architecture at a time: pytest runs a module-scoped parameter's tests together, so
    its sessions can go when they are done. Cached for every family at once (7 x 6 builds of
    a model, its ops graph and our graph) the file peaked at 11.7 GB and the suite kept it."""
    yield request.param
    _models.cache_clear()


@pytest.mark.parametrize("isa", list(ISAS))
@pytest.mark.parametrize("kv", ["float32", "float16"])
def test_the_kernel_gives_the_ops_graphs_logits(family, kv, isa, tokenizer, prompts):
    """Prefill logits of the longest prompt (past the sliding windows) within fp32 rounding of
    the ops graph's, the graph declaring our operator once per layer, no Softmax and no norm of
    the heads."""
    model, ops, kernel, proto = _models(family, len(tokenizer), kv, isa)
    kinds = [n.op_type for n in proto.graph.node]
    layers = model.config.num_hidden_layers
    assert kinds.count("KVAttention") == layers
    assert "Softmax" not in kinds
    # the heads' norms (Qwen3, Gemma 3) are the operator's; every other norm is our SkipNorm
    # (the first layer's input norm, two a layer, Gemma's sandwich norms), none ONNX Runtime's
    sandwich = architectures.ARCHITECTURES[model.config.model_type].sandwich_norms
    assert kinds.count("SkipNorm") == 1 + 2 * layers + (2 * layers if sandwich else 0)
    assert not any(kind.endswith("LayerNormalization") for kind in kinds)
    # a silu MLP's activation is ours too (the same bits as QuickGelu and Mul: its own test)
    silu = architectures.ARCHITECTURES[model.config.model_type].activation == "silu"
    assert kinds.count("GatedSilu") == (layers if silu else 0)
    assert "QuickGelu" not in kinds and kinds.count("FastGelu") == (0 if silu else layers)
    prompt = max(prompts, key=len)
    reference, _ = _prefill(ops, prompt)
    ours, _ = _prefill(kernel, prompt)
    scale = np.abs(reference).max()
    assert 0 < np.abs(ours - reference).max() <= RELATIVE[kv] * scale


def test_int8_values_are_near_the_fp16_graphs(family, tokenizer, prompts):
    """With int8 values (fused-int8-kernel's buffers) the graph declares the operator that
    stores them, the value buffers int8 [B, kv, W, head_dim + 4], and its logits stay near the
    fp16 graph's. Each value is within half a step of its head's 127, and these random tiny
    models carry that through every layer: measured mean |difference| 0.14-0.24% of the largest
    |logit| (the operator's numbers themselves are checked against float64 below); values read
    from the wrong place or with the wrong scale would be off by the logits' own size."""
    model, ops, kernel, proto = _models(family, len(tokenizer), "int8 values")
    kinds = [n.op_type for n in proto.graph.node]
    assert kinds.count("KVAttentionInt8Values") == model.config.num_hidden_layers
    assert "KVAttention" not in kinds
    values = [i for i in kernel.get_inputs() if i.name.endswith(".value")]
    keys = [i for i in kernel.get_inputs() if i.name.endswith(".key")]
    assert {i.type for i in values} == {"tensor(int8)"}
    assert {i.type for i in keys} == {"tensor(float16)"}
    assert {i.shape[3] for i in values} == {keys[0].shape[3] + 4}
    prompt = max(prompts, key=len)
    reference, _ = _prefill(ops, prompt)
    ours, _ = _prefill(kernel, prompt)
    scale = np.abs(reference).max()
    assert 0 < np.abs(ours - reference).mean() <= 5e-3 * scale


@pytest.mark.parametrize("isa", list(ISAS))
@pytest.mark.parametrize("kv", list(KV))
def test_a_token_is_the_same_bits_in_every_step_shape(family, kv, isa, tokenizer, prompts):
    """One prompt's logits, bit for bit: prefilled whole; its last 5 tokens one decode step
    each; its last 5 in one run of 5; in a buffer of another width; and batched with a longer
    prompt (rows at their own positions)."""
    _, _, kernel, _ = _models(family, len(tokenizer), kv, isa)
    prompt, other = sorted(prompts, key=len)[0], max(prompts, key=len)
    whole, _ = _prefill(kernel, prompt)
    whole = whole[0]
    n = len(prompt)
    _, past = _prefill(kernel, prompt[:-5])
    steps = []
    for i in range(n - 5, n):
        logits, past = _run(kernel, np.asarray([[prompt[i]]]), np.asarray([[i]]), past)
        steps.append(logits[0, -1])
    np.testing.assert_array_equal(np.stack(steps), whole[-5:])
    _, past = _prefill(kernel, prompt[:-5])
    chunk, _ = _run(kernel, np.asarray([prompt[-5:]]), np.arange(n - 5, n)[None], past)
    np.testing.assert_array_equal(chunk[0], whole[-5:])
    wide, _ = _prefill(kernel, prompt, room=ROOM + 37)
    np.testing.assert_array_equal(wide[0], whole)
    # batched: the short prompt padded at the end (its padding's positions continue past it)
    ids = np.zeros((2, len(other)), np.int64)
    ids[0, :n], ids[1] = prompt, other
    positions = np.tile(np.arange(len(other)), (2, 1))
    batched, _ = _run(kernel, ids, positions, _past(kernel, rows=2))
    np.testing.assert_array_equal(batched[0, :n], whole)
    alone, _ = _prefill(kernel, other)
    np.testing.assert_array_equal(batched[1], alone[0])


async def test_the_engine_runs_a_kernel_graph_exactly(tmp_path, tokenizer, prompts) -> None:
    """A prepared folder whose graph uses the operator: the runner registers it, and every
    request's tokens and logprobs are the same bits alone and batched with requests of other
    lengths joining at other steps (the batched ones also hit the prefix cache the lone ones
    filled, and speculate)."""
    model = build_tiny_model("llama3", len(tokenizer))
    graph = build_fused_model(model, attention="kernel", kv_dtype="float16")
    prepared = prepare_tiny(model, graph, tmp_path / "kernel", tokenizer, "fused-fp32")
    assert kernels.uses_kernels(prepared.onnx_path)
    params = SamplingParams(max_tokens=10, temperature=0, logprobs=True, top_logprobs=2)
    async with TokenGenerator(prepared, tokenizer=tokenizer) as engine:
        assert engine.runner.kv_in_place and engine.runner.exact_steps
        # our attention reads a token's own columns: spare ones cost nothing a step, so the
        # buffers keep the wider headroom (fewer re-allocations)
        assert not engine.runner.reads_every_column
        assert not engine._scheduler.kv.reads_every_column
        alone, batched = await alone_then_batched(engine, prompts, params)
    assert all(steps[0].logprobs for steps in alone)
    assert batched == alone * 2


def _writing_sessions(stored: int, isa: str, hd: int = 8):
    """KVAttention writing the new keys and values itself, and the standard graph's writes
    (Clip to float16's range and Cast when ``stored`` is FLOAT16, ScatterND) before the
    operator reading the buffers: one layer, 4 query heads on 2 KV heads of ``hd``."""
    from helpers.operators import operator_session
    from onnx import TensorProto, helper

    B, S, W, heads, kv = 2, 3, 6, 4, 2
    attrs = {"heads": heads, "scale": 0.35, "softcap": 0.0, "window": 0}
    inputs = [
        helper.make_tensor_value_info("q", TensorProto.FLOAT, [B, S, heads * hd]),
        helper.make_tensor_value_info("past_k", stored, [B, kv, W, hd]),
        helper.make_tensor_value_info("past_v", stored, [B, kv, W, hd]),
        helper.make_tensor_value_info("positions", TensorProto.INT64, [B, S]),
        helper.make_tensor_value_info("k", TensorProto.FLOAT, [B, S, kv * hd]),
        helper.make_tensor_value_info("v", TensorProto.FLOAT, [B, S, kv * hd]),
    ]
    outputs = [
        helper.make_tensor_value_info("out", TensorProto.FLOAT, [B, S, heads * hd]),
        helper.make_tensor_value_info("present_k", stored, [B, kv, W, hd]),
        helper.make_tensor_value_info("present_v", stored, [B, kv, W, hd]),
    ]
    fused = helper.make_node(
        "KVAttention",
        ["q", "past_k", "past_v", "positions", "k", "v"],
        ["out", "present_k", "present_v"],
        domain=kernels.DOMAIN,
        **attrs,
    )
    top = float(np.finfo(np.float16).max)
    bounds = [
        helper.make_tensor("low", TensorProto.FLOAT, [], [-top]),
        helper.make_tensor("high", TensorProto.FLOAT, [], [top]),
        helper.make_tensor("shape4", TensorProto.INT64, [4], [B, S, kv, hd]),
    ]
    nodes = []
    for x in ("k", "v"):
        nodes.append(helper.make_node("Reshape", [x, "shape4"], [f"{x}4"]))
        last = f"{x}4"
        if stored == TensorProto.FLOAT16:
            nodes.append(helper.make_node("Clip", [last, "low", "high"], [f"{x}_clip"]))
            nodes.append(helper.make_node("Cast", [f"{x}_clip"], [f"{x}_cast"], to=stored))
            last = f"{x}_cast"
        nodes.append(helper.make_node("ScatterND", [f"past_{x}", "index", last], [f"present_{x}"]))
    nodes.append(
        helper.make_node(
            "KVAttention",
            ["q", "present_k", "present_v", "positions"],
            ["out"],
            domain=kernels.DOMAIN,
            **attrs,
        )
    )
    index_input = helper.make_tensor_value_info("index", TensorProto.INT64, [B, S, kv, 3])
    flags = ISAS[isa]
    ours = operator_session([fused], inputs, outputs, [], flags)
    graphs = operator_session(nodes, [*inputs, index_input], outputs, bounds, flags)
    return ours, graphs, (B, S, W, heads, kv, hd)


def _index(positions: np.ndarray, kv: int) -> np.ndarray:
    """ScatterND's [B, S, kv, 3] (row, KV head, position) of each new key."""
    B, S = positions.shape
    rows = np.broadcast_to(np.arange(B)[:, None, None], (B, S, kv))
    heads = np.broadcast_to(np.arange(kv)[None, None, :], (B, S, kv))
    at = np.broadcast_to(positions[:, :, None], (B, S, kv))
    return np.stack([rows, heads, at], axis=-1).astype(np.int64)


def _in_place(session, feeds: dict[str, np.ndarray]) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """A writing run with each present buffer bound to its past's memory (the engine's
    binding): (the output, {"k": keys, "v": values} as written, copies of the feeds' pasts)."""
    import onnxruntime as ort

    binding = session.io_binding()
    binding.bind_output("out")  # first: ``get_outputs()`` lists them in binding order
    buffers = {"k": feeds["past_k"].copy(), "v": feeds["past_v"].copy()}
    for name, value in feeds.items():
        if name.startswith("past_"):
            buffer = ort.OrtValue.ortvalue_from_numpy(buffers[name[-1]])
            binding.bind_ortvalue_input(name, buffer)
            binding.bind_ortvalue_output(f"present_{name[-1]}", buffer)
        else:
            binding.bind_cpu_input(name, value)
    session.run_with_iobinding(binding)
    return binding.get_outputs()[0].numpy(), buffers


@pytest.mark.parametrize("isa", list(ISAS))
@pytest.mark.parametrize("kv_dtype", ["float16", "float32"])
def test_the_operators_writes_are_the_graphs_writes(kv_dtype, isa) -> None:
    """The same buffers and outputs, bit for bit, as Clip, Cast and ScatterND before it: values
    past float16's range clipped, a NaN kept, the untouched columns as they were; in place when
    present and past are one buffer (the engine's binding), a copy of the past otherwise."""
    from onnx import TensorProto

    stored = TensorProto.FLOAT16 if kv_dtype == "float16" else TensorProto.FLOAT
    try:
        ours, graphs, (B, S, W, heads, kv, hd) = _writing_sessions(stored, isa)
    except kernels.KernelsUnavailable as error:
        pytest.skip(str(error))
    rng = np.random.default_rng(4)
    dtype = np.dtype(kv_dtype)
    past_k = rng.standard_normal((B, kv, W, hd)).astype(dtype)
    past_v = rng.standard_normal((B, kv, W, hd)).astype(dtype)
    k = (rng.standard_normal((B, S, kv * hd)) * 3).astype(np.float32)
    v = (rng.standard_normal((B, S, kv * hd)) * 3).astype(np.float32)
    k[0, 0, :3] = [1e6, -1e6, np.nan]  # past float16's range, and a NaN
    v[1, 2, 5] = 7e4
    positions = np.array([[1, 2, 3], [3, 4, 5]], np.int64)
    q = rng.standard_normal((B, S, heads * hd)).astype(np.float32)
    feeds = {"q": q, "past_k": past_k, "past_v": past_v, "positions": positions, "k": k, "v": v}
    expected = graphs.run(None, {**feeds, "index": _index(positions, kv)})
    got = ours.run(None, feeds)  # fresh outputs: the past copied, then written
    for a, b in zip(got, expected, strict=True):
        np.testing.assert_array_equal(a, b)
    assert np.array_equal(past_k, feeds["past_k"])  # the inputs untouched
    out, buffers = _in_place(ours, feeds)
    np.testing.assert_array_equal(out, expected[0])
    np.testing.assert_array_equal(buffers["k"], expected[1])
    np.testing.assert_array_equal(buffers["v"], expected[2])
    with pytest.raises(Exception, match="outside the buffers"):
        ours.run(None, {**feeds, "positions": positions + 1})


@pytest.mark.parametrize("isa", list(ISAS))
def test_int8_values_are_written_as_numpy_rounds_them(isa) -> None:
    """KVAttentionInt8Values writing a step: each new value column is numpy's int8 rounding of
    the head with its scale after it (a head of zeros: scale 0; a head holding an inf or a NaN:
    scale NaN, so the outputs that weigh the column are NaN), the keys as KVAttention writes
    them, the other columns as they were; the same in place (the engine's binding); and the
    outputs are those of a run reading the written buffers back (prefill == decode)."""
    from helpers.operators import operator_session
    from onnx import TensorProto

    B, S, W, heads, kv, hd = 2, 3, 6, 4, 2, 24  # AVX-512: a vector and a tail a head
    attrs = {"heads": heads, "scale": 0.35, "softcap": 0.0, "window": 0}
    F, H, I8 = TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.INT8
    buffers = [_info("past_k", H, [B, kv, W, hd]), _info("past_v", I8, [B, kv, W, hd + 4])]
    inputs = [
        _info("q", F, [B, S, heads * hd]),
        *buffers,
        _info("positions", TensorProto.INT64, [B, S]),
        _info("k", F, [B, S, kv * hd]),
        _info("v", F, [B, S, kv * hd]),
    ]
    outputs = [
        _info("out", F, [B, S, heads * hd]),
        _info("present_k", H, [B, kv, W, hd]),
        _info("present_v", I8, [B, kv, W, hd + 4]),
    ]
    names = ["q", "past_k", "past_v", "positions", "k", "v"]
    writes = onnx.helper.make_node(
        "KVAttentionInt8Values",
        names,
        ["out", "present_k", "present_v"],
        domain=kernels.DOMAIN,
        **attrs,
    )
    reads = onnx.helper.make_node(
        "KVAttentionInt8Values", names[:4], ["out"], domain=kernels.DOMAIN, **attrs
    )
    try:
        ours = operator_session([writes], inputs, outputs, [], ISAS[isa])
        # the reader's value width left open: the operator checks it
        open_width = [*inputs[:2], _info("past_v", I8, [B, kv, W, "width"]), inputs[3]]
        reader = operator_session([reads], open_width, outputs[:1], [], ISAS[isa])
        fp16, _, _ = _writing_sessions(H, isa, hd)
    except kernels.KernelsUnavailable as error:
        pytest.skip(str(error))
    rng = np.random.default_rng(5)
    past_k = rng.standard_normal((B, kv, W, hd)).astype(np.float16)
    past_v, _ = _int8_columns(rng.standard_normal((B, kv, W, hd)).astype(np.float32))
    k = (rng.standard_normal((B, S, kv * hd)) * 3).astype(np.float32)
    v = (rng.standard_normal((B, S, kv * hd)) * 3).astype(np.float32)
    v[0, 1, :hd] = 0.0  # a head of zeros
    v[1, 2, hd + 5] = np.inf  # a head with an inf: its own column only
    positions = np.array([[1, 2, 3], [3, 4, 5]], np.int64)
    q = rng.standard_normal((B, S, heads * hd)).astype(np.float32)
    feeds = {"q": q, "past_k": past_k, "past_v": past_v, "positions": positions, "k": k, "v": v}
    out, present_k, present_v = ours.run(None, feeds)
    expected_v = past_v.copy()
    columns, scales = _int8_columns(v.reshape(B, S, kv, hd))
    for b in range(B):
        for s in range(S):
            expected_v[b, :, positions[b, s]] = columns[b, s]
    np.testing.assert_array_equal(present_v, expected_v)
    assert scales[0, 1, 0, 0] == 0 and np.isnan(scales[1, 2, 1, 0])
    fp16_feeds = {**feeds, "past_v": past_v[..., :hd].astype(np.float16)}
    np.testing.assert_array_equal(present_k, fp16.run(None, fp16_feeds)[1])
    (read,) = reader.run(
        None, {"q": q, "past_k": present_k, "past_v": present_v, "positions": positions}
    )
    np.testing.assert_array_equal(out, read)
    # the NaN column: seen by row 1's last position (KV head 1's query heads) only
    nan = np.isnan(out.reshape(B, S, heads, hd)).any(-1)
    expected_nan = np.zeros((B, S, heads), bool)
    expected_nan[1, 2, heads // 2 :] = True
    np.testing.assert_array_equal(nan, expected_nan)
    in_place, own = _in_place(ours, feeds)
    np.testing.assert_array_equal(in_place, out)
    np.testing.assert_array_equal(own["k"], present_k)
    np.testing.assert_array_equal(own["v"], expected_v)
    # a value buffer of the keys' width is refused, naming the shapes
    with pytest.raises(Exception, match=r"head_dim \+ 4"):
        reader.run(
            None, {"q": q, "past_k": past_k, "past_v": past_v[..., :hd], "positions": positions}
        )


def _info(name: str, elem_type: int, shape: list) -> onnx.ValueInfoProto:
    return onnx.helper.make_tensor_value_info(name, elem_type, shape)


def _int8_columns(v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """numpy's int8 value columns of ``v`` [..., hd] float32: scale = max |v| * float32(1 / 127),
    values rint(v / scale) (half to even) within [-127, 127], the scale's 4 bytes after them;
    returns (columns [..., hd + 4] int8, scales [..., 1] float32)."""
    peak = np.abs(v).max(-1, keepdims=True)
    scale = (peak * np.float32(1 / 127)).astype(np.float32)
    finite = np.isfinite(v).all(-1, keepdims=True)
    scale = np.where(finite, scale, np.float32(np.nan)).astype(np.float32)
    with np.errstate(invalid="ignore", divide="ignore"):
        q = np.clip(np.rint(v / scale), -127, 127)
    q = np.where(scale > 0, q, 0).astype(np.int8)
    scale_bytes = scale.view(np.int8).reshape(*scale.shape[:-1], 4)
    return np.concatenate([q, scale_bytes], axis=-1), scale


@pytest.mark.parametrize("isa", list(ISAS))
@pytest.mark.parametrize("buffers", list(KV))
@pytest.mark.parametrize("window", [0, 7])
def test_a_steps_rows_are_their_bits_alone(buffers, isa, window) -> None:
    """A step of many rows: the operator gives each thread runs of consecutive (row, KV head)
    items and prefetches the next item's keys and each item's values as it goes; every row's
    output is the same bits as the row alone, and near a float64 attention over the columns it
    sees (its position's, within the window; int8 values: their numbers, value times scale)."""
    from helpers.operators import operator_session
    from onnx import TensorProto

    kv_dtype, value_dtype = KV[buffers]
    B, W, heads, kv, hd, scale = 24, 40, 6, 2, 64, 0.125
    stored = TensorProto.FLOAT16 if kv_dtype == "float16" else TensorProto.FLOAT
    int8 = value_dtype == "int8"
    inputs = [
        _info("q", TensorProto.FLOAT, ["B", 1, heads * hd]),
        _info("keys", stored, ["B", kv, W, hd]),
        _info("values", TensorProto.INT8 if int8 else stored, ["B", kv, W, hd + 4 * int8]),
        _info("positions", TensorProto.INT64, ["B", 1]),
    ]
    outputs = [_info("out", TensorProto.FLOAT, ["B", 1, heads * hd])]
    node = onnx.helper.make_node(
        "KVAttentionInt8Values" if int8 else "KVAttention",
        ["q", "keys", "values", "positions"],
        ["out"],
        domain=kernels.DOMAIN,
        heads=heads,
        scale=scale,
        softcap=0.0,
        window=window,
    )
    try:
        session = operator_session([node], inputs, outputs, [], ISAS[isa])
    except kernels.KernelsUnavailable as error:
        pytest.skip(str(error))
    rng = np.random.default_rng(9)
    q = rng.standard_normal((B, 1, heads * hd)).astype(np.float32)
    keys = rng.standard_normal((B, kv, W, hd)).astype(kv_dtype)
    values = rng.standard_normal((B, kv, W, hd)).astype(kv_dtype)
    numbers = values.astype(np.float64)  # what a value column holds
    if int8:
        values, scales = _int8_columns(rng.standard_normal((B, kv, W, hd)).astype(np.float32))
        numbers = values[..., :hd].astype(np.float64) * scales
    positions = rng.integers(0, W, (B, 1)).astype(np.int64)
    positions[:2, 0] = [0, W - 1]  # one column, and all of them
    feeds = {"q": q, "keys": keys, "values": values, "positions": positions}
    (together,) = session.run(None, feeds)
    for row in range(B):
        (alone,) = session.run(None, {name: x[row : row + 1] for name, x in feeds.items()})
        np.testing.assert_array_equal(together[row], alone[0])
        end = int(positions[row, 0]) + 1
        begin = max(end - window, 0) if window else 0
        for head in range(heads):
            k = keys[row, head // (heads // kv), begin:end].astype(np.float64)
            v = numbers[row, head // (heads // kv), begin:end]
            scores = k @ q[row, 0, head * hd : (head + 1) * hd].astype(np.float64) * scale
            weights = np.exp(scores - scores.max())
            expected = weights @ v / weights.sum()
            got = together[row, 0, head * hd : (head + 1) * hd]
            np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)


def test_a_graph_names_the_operators_only_when_it_uses_them(tmp_path, tokenizer) -> None:
    model = build_tiny_model("llama3", len(tokenizer))
    for attention, expected in (("ops", False), ("kernel", True)):
        path = tmp_path / attention / "model.onnx"
        path.parent.mkdir()
        save_model(build_fused_model(model, attention=attention), path)
        assert kernels.uses_kernels(path) is expected


def test_without_headers_the_operators_say_how_to_get_them(tmp_path, monkeypatch) -> None:
    import sys

    monkeypatch.setenv(kernels.INCLUDE_ENV, str(tmp_path))
    monkeypatch.setattr(sys, "prefix", str(tmp_path))
    monkeypatch.setattr(kernels, "_SYSTEM_INCLUDES", ())
    with pytest.raises(kernels.KernelsUnavailable, match="make kernel-deps"):
        kernels.headers()


def test_without_headers_a_library_built_here_still_loads(tmp_path, monkeypatch) -> None:
    """An environment without the compiler or the headers (an engine-only venv sharing the
    cache) loads the library this machine built for this source; nothing else: another source
    (other sums) or none built is the error that says how to get the tools. The library is
    the one the other tests load from the user's cache (built once a run)."""
    import sys

    built, digest = kernels.library(), kernels.source_digest
    monkeypatch.setenv(kernels.INCLUDE_ENV, str(tmp_path / "none"))
    monkeypatch.setattr(sys, "prefix", str(tmp_path / "none"))
    monkeypatch.setattr(kernels, "_SYSTEM_INCLUDES", ())
    assert kernels.library() == built
    assert kernels.buildable()
    monkeypatch.setattr(kernels, "source_digest", lambda: "another")
    assert not kernels.buildable()
    with pytest.raises(kernels.KernelsUnavailable, match="make kernel-deps"):
        kernels.library()
    monkeypatch.setattr(kernels, "source_digest", digest)  # this source, in a cache of nothing
    with pytest.raises(kernels.KernelsUnavailable, match="make kernel-deps"):
        kernels.library(tmp_path / "empty")


def test_a_failed_compile_names_its_command_and_the_compilers_words(tmp_path) -> None:
    """The sources compile at once, one ``g++`` each: one that fails is the error (its command
    and what the compiler said), and the cache keeps nothing of the build."""
    with pytest.raises(kernels.KernelsUnavailable, match="-fno-such-option") as failed:
        kernels.library(tmp_path, flags=("-fno-such-option",))
    assert "unrecognized command-line option" in str(failed.value)
    assert " -c " in str(failed.value)  # a source's own command, not the link's
    assert list((tmp_path / "kernels").iterdir()) == []
    assert list((tmp_path / "tmp").iterdir()) == []


def _layer_signature(stored: int, shape: tuple[int, ...], half: int) -> tuple[list, list]:
    """The inputs and outputs of a one-layer graph around KVAttention: the packed projection,
    the buffers (``stored`` type), positions and rotary tables (``half`` wide) in; the
    attention and the present buffers out. ``shape``: (B, S, W, heads, kv, hd)."""
    from onnx import TensorProto, helper

    B, S, W, heads, kv, hd = shape
    inputs = [
        helper.make_tensor_value_info("qkv", TensorProto.FLOAT, [B, S, (heads + 2 * kv) * hd]),
        *(helper.make_tensor_value_info(n, stored, [B, kv, W, hd]) for n in ("past_k", "past_v")),
        helper.make_tensor_value_info("positions", TensorProto.INT64, [B, S]),
        helper.make_tensor_value_info("cos", TensorProto.FLOAT, ["P", half]),
        helper.make_tensor_value_info("sin", TensorProto.FLOAT, ["P", half]),
    ]
    outputs = [
        helper.make_tensor_value_info("out", TensorProto.FLOAT, [B, S, heads * hd]),
        *(helper.make_tensor_value_info(f"present_{x}", stored, [B, kv, W, hd]) for x in "kv"),
    ]
    return inputs, outputs


def _layer_feeds(rng, qkv: np.ndarray, kv_dtype: str, shape: tuple[int, ...], half: int, P: int):
    """A one-layer graph's feeds (``_layer_signature``): ``qkv``, random buffers of
    ``kv_dtype``, two rows at their own positions, rotary tables of ``P`` positions."""
    B, kv, W, hd = shape
    angles = np.arange(P)[:, None] * (0.9 ** np.arange(half))[None]
    return {
        "qkv": qkv.astype(np.float32),
        "past_k": rng.standard_normal((B, kv, W, hd)).astype(kv_dtype),
        "past_v": rng.standard_normal((B, kv, W, hd)).astype(kv_dtype),
        "positions": np.array([[2, 3, 4, 5, 6], [4, 5, 6, 7, 8]], np.int64),
        "cos": np.cos(angles).astype(np.float32),
        "sin": np.sin(angles).astype(np.float32),
    }


def _rotating_sessions(stored: int, isa: str, hd: int, rotary_dim: int):
    """Three graphs of one layer, 6 query heads on 2 KV heads: the projection split and rotated
    by ONNX Runtime's Split and RotaryEmbedding before KVAttention; KVAttention given the packed
    projection and the tables; and KVAttention given the split heads and the tables (how the
    families with a norm on each head use it when the heads' width is not a multiple of 8)."""
    from helpers.operators import operator_session
    from onnx import TensorProto, helper

    B, S, W, heads, kv, P = 2, 5, 9, 6, 2, 12
    width = (heads + 2 * kv) * hd
    attrs = {"heads": heads, "scale": 0.3, "softcap": 0.0, "window": 0}
    inputs, outputs = _layer_signature(stored, (B, S, W, heads, kv, hd), rotary_dim // 2)
    present = ["out", "present_k", "present_v"]
    sizes = [helper.make_tensor("sizes", TensorProto.INT64, [3], [heads * hd, kv * hd, kv * hd])]
    split = helper.make_node("Split", ["qkv", "sizes"], ["q", "k", "v"], axis=-1)
    partial = {} if rotary_dim == hd else {"rotary_embedding_dim": rotary_dim}
    rotations = [
        helper.make_node(
            "RotaryEmbedding",
            [x, "positions", "cos", "sin"],
            [f"{x}_rotated"],
            domain="com.microsoft",
            interleaved=0,
            num_heads=n,
            **partial,
        )
        for x, n in (("q", heads), ("k", kv))
    ]
    graph = helper.make_node(
        "KVAttention",
        ["q_rotated", "past_k", "past_v", "positions", "k_rotated", "v"],
        present,
        domain=kernels.DOMAIN,
        **attrs,
    )
    packed = helper.make_node(
        "KVAttention",
        ["qkv", "past_k", "past_v", "positions", "", "", "cos", "sin"],
        present,
        domain=kernels.DOMAIN,
        kv_heads=kv,
        **attrs,
    )
    apart = helper.make_node(
        "KVAttention",
        ["q", "past_k", "past_v", "positions", "k", "v", "cos", "sin"],
        present,
        domain=kernels.DOMAIN,
        **attrs,
    )
    flags = ISAS[isa]
    return (
        operator_session([split, *rotations, graph], inputs, outputs, sizes, flags),
        operator_session([packed], inputs, outputs, [], flags),
        operator_session([split, apart], inputs, outputs, sizes, flags),
        (B, S, W, heads, kv, P, width),
    )


@pytest.mark.parametrize("isa", list(ISAS))
@pytest.mark.parametrize("kv_dtype", ["float16", "float32"])
@pytest.mark.parametrize(("hd", "rotary_dim"), [(32, 32), (24, 24), (24, 16), (32, 12)])
def test_the_operator_splits_and_rotates_as_the_graph_does(kv_dtype, isa, hd, rotary_dim) -> None:
    """Given the packed projection (or the split heads) and the rotary tables, the operator's
    output and buffers are the bits of Split and RotaryEmbedding before it: full and partial
    rotary, half widths with and without a remainder past 8 lanes; a position past the tables
    is an error, not a read past them."""
    from onnx import TensorProto

    stored = TensorProto.FLOAT16 if kv_dtype == "float16" else TensorProto.FLOAT
    try:
        graph, packed, apart, (B, S, W, _, kv, P, width) = _rotating_sessions(
            stored, isa, hd, rotary_dim
        )
    except kernels.KernelsUnavailable as error:
        pytest.skip(str(error))
    rng = np.random.default_rng(7)
    qkv = rng.standard_normal((B, S, width)) * 2
    feeds = _layer_feeds(rng, qkv, kv_dtype, (B, kv, W, hd), rotary_dim // 2, P)
    expected = graph.run(None, feeds)
    for session in (packed, apart):
        got = session.run(None, feeds)
        for a, b in zip(got, expected, strict=True):
            np.testing.assert_array_equal(a, b)
    assert not np.array_equal(expected[1], feeds["past_k"])  # the columns were written
    cut = {**feeds, "cos": feeds["cos"][:8], "sin": feeds["sin"][:8]}
    with pytest.raises(Exception, match="rotary tables"):
        packed.run(None, cut)


def _norming_sessions(stored: int, isa: str, hd: int, rotary: bool):
    """Two graphs of one layer, 4 query heads on 2 KV heads, each head RMS-normed before the
    rotary (Qwen3, Gemma 3): ONNX Runtime's Split, Reshape, SimplifiedLayerNormalization and
    RotaryEmbedding before KVAttention; and KVAttention given the packed projection, the tables
    and the two norms' weights."""
    from helpers.operators import operator_session
    from onnx import TensorProto, helper, numpy_helper

    B, S, W, heads, kv, P, eps = 2, 5, 9, 4, 2, 12, 1e-6
    width = (heads + 2 * kv) * hd
    attrs = {"heads": heads, "scale": 0.3, "softcap": 0.0, "window": 0}
    inputs, outputs = _layer_signature(stored, (B, S, W, heads, kv, hd), hd // 2)
    present = ["out", "present_k", "present_v"]
    rng = np.random.default_rng(11)
    constants = [
        helper.make_tensor("sizes", TensorProto.INT64, [3], [heads * hd, kv * hd, kv * hd]),
        helper.make_tensor("heads_shape", TensorProto.INT64, [4], [0, 0, -1, hd]),
        helper.make_tensor("flat", TensorProto.INT64, [3], [0, 0, -1]),
        *(
            numpy_helper.from_array((1 + 0.5 * rng.standard_normal(hd)).astype(np.float32), n)
            for n in ("q_gamma", "k_gamma")
        ),
    ]
    nodes = [helper.make_node("Split", ["qkv", "sizes"], ["q", "k", "v"], axis=-1)]
    for x in "qk":
        nodes += [
            helper.make_node("Reshape", [x, "heads_shape"], [f"{x}_heads"]),
            helper.make_node(
                "SimplifiedLayerNormalization",
                [f"{x}_heads", f"{x}_gamma"],
                [f"{x}_normed"],
                axis=-1,
                epsilon=eps,
                stash_type=1,
            ),
            helper.make_node("Reshape", [f"{x}_normed", "flat"], [f"{x}_flat"]),
        ]
        if rotary:
            nodes.append(
                helper.make_node(
                    "RotaryEmbedding",
                    [f"{x}_flat", "positions", "cos", "sin"],
                    [f"{x}_rotated"],
                    domain="com.microsoft",
                    interleaved=0,
                    num_heads=heads if x == "q" else kv,
                )
            )
    last = "rotated" if rotary else "flat"
    nodes.append(
        helper.make_node(
            "KVAttention",
            [f"q_{last}", "past_k", "past_v", "positions", f"k_{last}", "v"],
            present,
            domain=kernels.DOMAIN,
            **attrs,
        )
    )
    tables = ["cos", "sin"] if rotary else ["", ""]
    packed = helper.make_node(
        "KVAttention",
        ["qkv", "past_k", "past_v", "positions", "", "", *tables, "q_gamma", "k_gamma"],
        present,
        domain=kernels.DOMAIN,
        kv_heads=kv,
        epsilon=eps,
        **attrs,
    )
    apart = helper.make_node(  # heads split: the operator norms packed heads only
        "KVAttention",
        ["q", "past_k", "past_v", "positions", "k", "v", *tables, "q_gamma", "k_gamma"],
        present,
        domain=kernels.DOMAIN,
        epsilon=eps,
        **attrs,
    )
    flags = ISAS[isa]
    return (
        operator_session(nodes, inputs, outputs, constants, flags),
        operator_session([packed], inputs, outputs, constants[3:], flags),
        operator_session([nodes[0], apart], inputs, outputs, constants, flags),
        (B, S, W, kv, P, width),
    )


@pytest.mark.parametrize("isa", list(ISAS))
@pytest.mark.parametrize("kv_dtype", ["float16", "float32"])
@pytest.mark.parametrize(("hd", "rotary"), [(32, True), (128, True), (256, True), (64, False)])
def test_the_operator_norms_heads_as_the_graph_does(kv_dtype, isa, hd, rotary) -> None:
    """Given the packed projection and the norms' weights, the operator's output and buffers
    are the bits of Split, SimplifiedLayerNormalization (and RotaryEmbedding) before it, for
    heads of widely different scales (Qwen3's and Gemma 3's head widths, 128 and 256); norms
    for heads already split are refused, not ignored."""
    from onnx import TensorProto

    stored = TensorProto.FLOAT16 if kv_dtype == "float16" else TensorProto.FLOAT
    try:
        graph, packed, apart, (B, S, W, kv, P, width) = _norming_sessions(stored, isa, hd, rotary)
    except kernels.KernelsUnavailable as error:
        pytest.skip(str(error))
    rng = np.random.default_rng(5)
    scales = np.exp(rng.uniform(-6, 6, (B, S, width // hd, 1)))  # each head its own scale
    qkv = (rng.standard_normal((B, S, width // hd, hd)) * scales).reshape(B, S, width)
    feeds = _layer_feeds(rng, qkv, kv_dtype, (B, kv, W, hd), hd // 2, P)
    expected = graph.run(None, feeds)
    got = packed.run(None, feeds)
    for a, b in zip(got, expected, strict=True):
        np.testing.assert_array_equal(a, b)
    assert not np.array_equal(expected[1], feeds["past_k"])  # the columns were written
    with pytest.raises(Exception, match="q_norm and k_norm come together"):
        apart.run(None, feeds)
