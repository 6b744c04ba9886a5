"""The fused graph builder: same logits as the Optimum export, end padding, refusal, fallback."""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import pytest
from helpers.engine import PROMPTS, chat_ids, collect, run_all, tokens, torch_greedy

from nbresponses.models.fidelity import FIDELITY_CONVERSATION, full_sequence_logits
from nbresponses.models.fused import UnsupportedArchitecture, check_supported
from nbresponses.models.prepare import prepare_model
from nbresponses.runtime.generator import TokenGenerator
from nbresponses.tokens.contract import SamplingParams

GREEDY = SamplingParams(max_tokens=24, temperature=0)


def _session(path: Path):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def _conversation_ids(tokenizer) -> list[int]:
    return list(tokenizer.apply_chat_template(FIDELITY_CONVERSATION[:2], tokenize=True))


def test_io_names_of_the_optimum_export(tiny_fused, tiny_model) -> None:
    """The Optimum export's names and meaning, without the mask (the positions say where each
    token goes) and with ``num_logits_to_keep``; each present is its past buffer, written in
    place, so both have the same (symbolic) width."""
    ours, theirs = _session(tiny_fused.onnx_path), _session(tiny_model.onnx_path)
    expected = [i.name for i in theirs.get_inputs() if i.name != "attention_mask"]
    expected.insert(2, "num_logits_to_keep")
    assert [i.name for i in ours.get_inputs()] == expected
    assert [o.name for o in ours.get_outputs()] == [o.name for o in theirs.get_outputs()]
    outputs = {o.name: o for o in ours.get_outputs()}
    for a in ours.get_inputs():
        if a.name.startswith("past_key_values"):
            present = outputs[a.name.replace("past_key_values.", "present.")]
            assert a.shape == present.shape and a.shape[2] == "past_sequence_length"
    meta = ours.get_modelmeta().custom_metadata_map
    assert meta["nbresponses.kv_layout"] == "scatter-in-place"


def test_graph_is_fused(tiny_fused, tiny_model) -> None:
    """Attention from standard ops (``models/attention.py``), everything else fused."""
    ops = Counter(n.op_type for n in onnx.load(str(tiny_fused.onnx_path)).graph.node)
    layers = tiny_model.config["num_hidden_layers"]
    assert ops["GroupQueryAttention"] == 0
    assert ops["SkipSimplifiedLayerNormalization"] == 2 * layers
    # packed qkv, o, packed gate/up, down and probabilities x values; the LM head
    assert ops["MatMul"] == 5 * layers + 1
    assert ops["FusedMatMul"] == ops["Softmax"] == layers
    assert ops["ScatterND"] == ops["RotaryEmbedding"] == 2 * layers
    assert not {"Pow", "ReduceMean", "Sin", "Cos"} & set(ops)
    assert sum(ops.values()) <= 22 * layers + 40


def test_logits_equal_the_optimum_export(tiny_fused, tiny_model, tokenizer) -> None:
    ids = _conversation_ids(tokenizer)
    ours = full_sequence_logits(_session(tiny_fused.onnx_path), ids)
    theirs = full_sequence_logits(_session(tiny_model.onnx_path), ids)
    assert ours.shape == theirs.shape
    # fp32 rounding only (different summation order): ~1e-5 of the logit scale here
    assert np.abs(ours - theirs).max() <= 1e-4 * np.abs(theirs).max()
    assert tiny_fused.fidelity["top1_agreement"] == 1.0
    assert tiny_fused.fidelity["max_abs_dlogprob"] < 1e-3


def test_logits_of_the_last_positions_only_on_request(tiny_fused, tokenizer) -> None:
    """``num_logits_to_keep``: absent or 0 gives every position (fidelity, Optimum callers); 1
    gives the last only (the engine's prefill), with the same values."""
    session = _session(tiny_fused.onnx_path)
    ids = np.asarray([_conversation_ids(tokenizer)[:20]], np.int64)
    feeds = {
        "input_ids": ids,
        "position_ids": np.arange(ids.shape[1], dtype=np.int64)[None],
    }
    for inp in session.get_inputs():
        if inp.name.startswith("past_key_values"):  # room for the 20 tokens, written in place
            feeds[inp.name] = np.zeros((1, inp.shape[1], 20, inp.shape[3]), np.float32)
    full = session.run(["logits"], {**feeds, "num_logits_to_keep": np.array([0])})[0]
    assert full.shape[1] == 20
    for keep in (1, 3):
        some = session.run(["logits"], {**feeds, "num_logits_to_keep": np.array([keep])})[0]
        assert some.shape[1] == keep
        np.testing.assert_allclose(some, full[:, -keep:], rtol=0, atol=1e-5)


@pytest.mark.parametrize("model", ["tiny_fused", "bundled_model"])
def test_kept_positions_are_the_bits_of_every_position(request, model) -> None:
    """What the engine's scoring runs ask: the logits of a run's last positions only (the LM
    head skips the others), alone and as rows of one multi-token step, are the same bits as
    those positions' logits when every position is computed (the default recipe's own
    operators on the bundled model)."""
    from nbresponses.runtime.kv import EndPaddedKV
    from nbresponses.runtime.runner import OnnxRunner

    runner = OnnxRunner(request.getfixturevalue(model).onnx_path)
    ids = np.arange(100, 124, dtype=np.int64)[None]
    positions = np.arange(24, dtype=np.int64)[None]
    every, _ = runner.run(ids, None, positions, runner.layout.empty(), position=None)
    every = np.array(every)
    for keep in (1, 5, 23):
        some, _ = runner.run(ids, None, positions, runner.layout.empty(), position=None, keep=keep)
        np.testing.assert_array_equal(some, every[-keep:])
    rows = EndPaddedKV(runner.layout, reads_every_column=runner.reads_every_column)
    rows.add_rows([[a[0] for a in runner.layout.empty()]] * 2)
    both = rows.step_tokens(runner, [list(range(100, 124)), list(range(100, 110))], keep=6)
    assert both.shape[:2] == (2, 6)
    np.testing.assert_array_equal(both[0], every[-6:])


@pytest.mark.parametrize("budget", ["default", "a row a run"])
@pytest.mark.parametrize("model", ["tiny_fused", "bundled_model"])
def test_prepares_greedy_continuations_together_are_each_alone(
    request, model, budget, prompts, monkeypatch
) -> None:
    """Prepare's fidelity decodes its samples' greedy continuations as the rows of one run:
    each row's tokens are those of the prompt decoded alone (one row at a time, a cache grown
    step by step), with prompts of different lengths, a row that stops early (a stop token
    met) while the others go on, and rows grouped by length under a KV budget."""
    import onnxruntime as ort

    from nbresponses.models import fidelity, kernels
    from nbresponses.models.graph_contract import KV_LAYOUT, SCATTER_IN_PLACE

    path = request.getfixturevalue(model).onnx_path
    options = kernels.for_model(ort.SessionOptions(), path)  # the default recipe's operators
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    assert session.get_modelmeta().custom_metadata_map[KV_LAYOUT] == SCATTER_IN_PLACE
    alone = [fidelity.greedy_continuation(session, ids, 12, set()) for ids in prompts]
    stop = {alone[0][3]}  # the first prompt's fourth token ends it there (or before)
    alone = [fidelity.greedy_continuation(session, ids, 12, stop) for ids in prompts]
    assert len({len(ids) for ids in prompts}) > 1 and len(alone[0]) <= 4
    assert any(len(tokens) == 12 for tokens in alone)
    if budget != "default":
        monkeypatch.setattr(fidelity, "ROWS_KV_BYTES", 1)
    runs, rows = [], fidelity._rows
    monkeypatch.setattr(fidelity, "_rows", lambda s, p, *a: runs.append(len(p)) or rows(s, p, *a))
    assert fidelity.greedy_continuations(session, prompts, 12, stop) == alone
    assert runs == ([len(prompts)] if budget == "default" else [1] * len(prompts))


def test_the_engine_asks_for_the_last_position_only(tiny_fused, tiny_model) -> None:
    from nbresponses.runtime.runner import OnnxRunner

    assert OnnxRunner(tiny_fused.onnx_path).last_logits_only
    assert not OnnxRunner(tiny_model.onnx_path).last_logits_only  # the Optimum graph has no input


def test_a_row_batched_with_garbage_padding_equals_the_row_alone(tiny_fused) -> None:
    """One decode step for two rows of different lengths, the shorter one's spare columns full
    of garbage: the shorter row gets exactly its logits alone (each row's keys stay at their
    columns, and the mask keeps a row to its own positions)."""
    from nbresponses.runtime.kv import EndPaddedKV
    from nbresponses.runtime.runner import OnnxRunner

    runner = OnnxRunner(tiny_fused.onnx_path)
    empty = runner.layout.empty()
    rows = [list(range(10, 20)), list(range(30, 36))]
    prefilled = [
        runner.run(np.array([r]), None, np.arange(len(r))[None], empty)[1]
        for r in rows  # type: ignore[arg-type]
    ]
    alone = EndPaddedKV(runner.layout, reads_every_column=True)
    alone.add_rows([[a[0] for a in prefilled[1]]])
    expected = np.array(alone.step(runner, [60])[0])
    batch = EndPaddedKV(runner.layout, reads_every_column=True)
    batch.add_rows([[a[0] for a in p] for p in prefilled])
    noise = np.random.default_rng(0)
    for buffer in batch._values:  # the shorter row's unused columns: garbage
        buffer[1, :, 6:] = noise.normal(0, 30, buffer[1, :, 6:].shape)
    np.testing.assert_array_equal(batch.step(runner, [50, 60])[1], expected)


def test_every_step_shape_gives_the_same_bits(tiny_fused, tiny_source, tokenizer) -> None:
    """A token's logits and KV are the same bits whether its position is computed in one
    prefill, one token at a time, in chunks of any size, or among batch-mates that feed other
    numbers of tokens: what makes speculation, mixed steps and caching decoded KV exact. A
    GroupQueryAttention graph of the same weights does not do that (its one-token kernel sums
    in another order), which is why the fused graph no longer uses it."""
    import onnxruntime as ort
    from transformers import AutoModelForCausalLM

    from nbresponses.models.fused import build_fused_model
    from nbresponses.runtime.kv import EndPaddedKV
    from nbresponses.runtime.runner import OnnxRunner

    runner = OnnxRunner(tiny_fused.onnx_path)
    ids = _conversation_ids(tokenizer)[:48]

    def schedule(chunks: list[int], mates: int = 0) -> tuple[np.ndarray, list[np.ndarray]]:
        noise = np.random.default_rng(len(chunks) + mates)
        kv = EndPaddedKV(runner.layout, reads_every_column=True)
        first = runner.run(np.array([ids[:2]]), None, np.arange(2)[None], runner.layout.empty())
        starts = [runner.run(np.array([[5, 6]]), None, np.arange(2)[None], runner.layout.empty())]
        kv.add_rows([[a[0] for a in first[1]]] + [[a[0] for a in starts[0][1]]] * mates)
        out, at = [first[0][0]], 2
        for n in chunks:
            mate_tokens = [[int(t) for t in noise.integers(0, 1000, noise.integers(1, 4))]
                           for _ in range(mates)]  # fmt: skip
            logits = kv.step_tokens(runner, [ids[at : at + n], *mate_tokens])
            out.extend(np.array(logits[0, :n]))
            at += n
        return np.stack(out[:-1]), kv.row(0)

    one_by_one = schedule([1] * 46)
    for chunks, mates in (([46], 0), ([3, 1, 7, 1, 16, 2, 16], 0), ([1] * 46, 3), ([5, 9, 32], 2)):
        logits, kv = schedule(chunks, mates)
        np.testing.assert_array_equal(logits, one_by_one[0], err_msg=f"{chunks} {mates}")
        for a, b in zip(kv, one_by_one[1], strict=True):
            np.testing.assert_array_equal(a, b)

    model = AutoModelForCausalLM.from_pretrained(str(tiny_source)).eval()
    gqa = ort.InferenceSession(
        build_fused_model(model, attention="gqa").SerializeToString(),
        providers=["CPUExecutionProvider"],
    )
    names = [i.name for i in gqa.get_inputs() if i.name.startswith("past_key_values")]

    def run(tokens: list[int], start: int, past: list[np.ndarray]):
        feeds = {
            "input_ids": np.array([tokens]),
            "attention_mask": np.ones((1, start + len(tokens)), np.int64),
            "position_ids": np.arange(start, start + len(tokens))[None],
            **dict(zip(names, past, strict=True)),
        }
        logits, *present = gqa.run(None, feeds)
        return logits[0], present

    whole, _ = run(ids[:12], 0, [np.zeros((1, 2, 0, 16), np.float32)] * len(names))
    _, past = run(ids[:11], 0, [np.zeros((1, 2, 0, 16), np.float32)] * len(names))
    step, _ = run(ids[11:12], 11, past)
    assert not np.array_equal(step[0], whole[11])  # equal to rounding only
    np.testing.assert_allclose(step[0], whole[11], rtol=0, atol=1e-3 * np.abs(whole).max())


@pytest.mark.slow
async def test_engine_greedy_matches_pytorch_batched_and_alone(tiny_fused, tiny_source, tokenizer):
    from transformers import AutoModelForCausalLM

    torch_tiny = AutoModelForCausalLM.from_pretrained(str(tiny_source)).eval()
    prompts = [chat_ids(tokenizer, text) for text in PROMPTS]
    expected = [torch_greedy(torch_tiny, p, 24, tokenizer.eos_token_id) for p in prompts]
    async with TokenGenerator(tiny_fused, tokenizer=tokenizer) as engine:
        alone = [tokens((await collect(engine, p, GREEDY))[0]) for p in prompts]
        batched = await run_all(engine, prompts * 2, GREEDY)
    assert alone == expected
    assert batched == expected * 2


async def test_in_place_kv_joins_leaves_and_grows(tiny_fused, tiny_model, tokenizer, monkeypatch):
    """Rows join a running batch, leave it and outgrow the buffers' spare columns (headroom 3),
    and every row still decodes as it does alone on the Optimum graph (copying KV each step)."""
    from nbresponses.runtime import kv

    monkeypatch.setattr(kv, "HEADROOM", 3)
    monkeypatch.setattr(kv, "SCATTER_HEADROOM", 3)
    prompts = [chat_ids(tokenizer, text) for text in PROMPTS]
    lengths = [SamplingParams(max_tokens=n, temperature=0) for n in (40, 5, 17, 2, 33, 9)]

    async def staggered(prepared):
        async with TokenGenerator(prepared, tokenizer=tokenizer, prefix_cache_bytes=0) as engine:
            assert engine.runner.kv_in_place is (prepared is tiny_fused)
            tasks = []
            for prompt, params in zip(prompts, lengths, strict=True):
                tasks.append(asyncio.create_task(collect(engine, prompt, params)))
                await asyncio.sleep(0.01)
            return [tokens(steps) for steps, _ in await asyncio.gather(*tasks)]

    assert await staggered(tiny_fused) == await staggered(tiny_model)


@pytest.mark.parametrize("bits", [8, 4])
def test_weights_quantized_as_built_equal_quantizing_the_fp32_graph(
    bits: int, tiny_source: Path, tmp_path: Path
) -> None:
    """The fused recipes quantize each matrix as the graph is built (and write it to the side
    file at once): the same initializers, nodes and logits, bit for bit, as quantizing the
    whole fp32 graph with onnxruntime's MatMulNBitsQuantizer afterwards (the former recipe)."""
    from onnx import numpy_helper

    from nbresponses.models.fused import build_fused_model, load_source_model, save_model
    from nbresponses.models.recipes import quantize_nbits
    from nbresponses.models.sources import resolve_source

    model = load_source_model(resolve_source(tiny_source))
    former = quantize_nbits(build_fused_model(model), bits, quantize_head=True).model
    target = tmp_path / "model.onnx"
    save_model(build_fused_model(model, bits=bits, weights=tmp_path / "model.onnx.data"), target)
    assert target.stat().st_size < 100_000, "the weights are in the side file"
    built = onnx.load(str(target))

    def tensors(m) -> dict:
        return {
            t.name: (t.data_type, list(t.dims), numpy_helper.to_array(t).tobytes())
            for t in m.graph.initializer
        }

    assert tensors(built) == tensors(former)
    assert [onnx.helper.printable_node(n) for n in built.graph.node] == [
        onnx.helper.printable_node(n) for n in former.graph.node
    ]
    former_path = tmp_path / "former.onnx"
    onnx.save_model(former, str(former_path))
    ids = list(range(3, 60))
    a = full_sequence_logits(_session(former_path), ids)
    b = full_sequence_logits(_session(target), ids)
    assert np.array_equal(a, b)


def test_unsupported_architectures_are_refused_with_the_reason() -> None:
    from transformers import GPT2Config, LlamaConfig

    with pytest.raises(UnsupportedArchitecture, match=r"model_type 'gpt2'.*Optimum recipe"):
        check_supported(GPT2Config())
    with pytest.raises(UnsupportedArchitecture, match="hidden_act 'gelu'"):
        check_supported(LlamaConfig(hidden_act="gelu"))
    with pytest.raises(UnsupportedArchitecture, match="rope_scaling 'dynamic'"):
        check_supported(LlamaConfig(rope_scaling={"rope_type": "dynamic", "factor": 2.0}))
    check_supported(LlamaConfig())


@pytest.fixture(scope="module")
def gelu_source(tmp_path_factory, tokenizer_dir: Path) -> Path:
    """A tiny Llama the fused builder refuses (gelu MLP) but Optimum exports."""
    from helpers.tiny_model import build_tiny_llama

    folder = build_tiny_llama(tmp_path_factory.mktemp("gelu") / "src", tokenizer_dir)
    import json

    config = json.loads((folder / "config.json").read_text())
    config["hidden_act"] = "gelu"
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def test_explicit_fused_recipe_on_unsupported_model_fails_cleanly(gelu_source, tmp_path) -> None:
    with pytest.raises(UnsupportedArchitecture, match="hidden_act"):
        prepare_model(gelu_source, "fused-q8", cache_dir=tmp_path, progress=False)
    assert not list((tmp_path / "models").glob("*"))
    assert not list((tmp_path / "tmp").iterdir())


@pytest.mark.slow
def test_auto_falls_back_to_optimum_recipes(gelu_source, tmp_path, monkeypatch) -> None:
    from nbresponses.models import prepare

    monkeypatch.setitem(prepare.ALIASES, "auto", ("fused-q8", "fp32"))
    prepared = prepare_model(gelu_source, cache_dir=tmp_path, progress=False)
    assert prepared.recipe == "fp32"


def test_auto_puts_the_operators_recipe_first_only_where_it_can_build() -> None:
    """With VNNI or without (GroupProduct has AVX2 code): wherever the operators build."""
    from nbresponses.models.recipes import auto_order

    assert auto_order(operators=True)[:2] == ("fused-int8-kernel", "fused-q8")
    assert auto_order(operators=False)[0] == "fused-q8"
    assert not any(name.endswith("-kernel") for name in auto_order(operators=False))


def test_the_operators_recipe_has_8_bit_weights_without_vnni_too(monkeypatch) -> None:
    """The 7-bit weights that MLAS's AVX2 products need (fused-int8) are not GroupProduct's: its
    sums are exact for 8-bit weights on every CPU, so a model prepared with or without VNNI is
    the same model."""
    from nbresponses.models import recipes

    built: dict[str, object] = {}

    def build(model, **kwargs):
        built.update(kwargs)
        raise RuntimeError("stop")

    monkeypatch.setattr(recipes, "INTEGER_WEIGHT_BITS", 7)
    monkeypatch.setattr(recipes, "activation_peaks", lambda *args, **kwargs: {})
    monkeypatch.setattr(recipes, "fused_supported", lambda source: None)
    monkeypatch.setattr(recipes.fused, "build_fused_model", build)
    source = type("Source", (), {"model": None, "tokenizer": None, "tensors": None})()
    for quantizer, bits in (("kernel", 8), ("ops", 7)):
        with pytest.raises(RuntimeError, match="stop"):
            recipes.fused_integer(attention="kernel", quantizer=quantizer)(source, Path("m"))
        assert built["integer"] == bits, quantizer
    assert recipes.RECIPES["fused-int8-kernel"].params["weight_bits"] == 8


@pytest.mark.slow
def test_auto_moves_on_when_our_operators_fail_to_build(tiny_source, tmp_path, monkeypatch):
    """A compiler or headers that fail at build time (after ``buildable()`` said yes): ``auto``
    prepares the next recipe; the explicit recipe says why it cannot."""
    from nbresponses.models import kernels, prepare

    def broken(*args, **kwargs):
        raise kernels.KernelsUnavailable("building nbresponses' ONNX operators failed: test")

    monkeypatch.setattr(kernels, "library", broken)
    monkeypatch.setitem(prepare.ALIASES, "auto", ("fused-int8-kernel", "fp32"))
    assert prepare_model(tiny_source, cache_dir=tmp_path, progress=False).recipe == "fp32"
    assert not list((tmp_path / "models").glob("*-fused-int8-kernel-*"))
    with pytest.raises(kernels.KernelsUnavailable, match="failed: test"):
        prepare_model(tiny_source, "fused-int8-kernel", cache_dir=tmp_path, progress=False)


@pytest.mark.slow
def test_analysis_is_fp32_weights_in_the_fastest_graph(gelu_source, tiny_source, cache_dir):
    """One argument for logprobs close to fp32: the fused fp32 graph, or the Optimum fp32
    export for a model the fused builder does not cover."""
    assert prepare_model(tiny_source, "analysis", cache_dir=cache_dir, progress=False).recipe == (
        "fused-fp32"
    )
    assert prepare_model(gelu_source, "analysis", cache_dir=cache_dir, progress=False).recipe == (
        "fp32"
    )


# --- the real bundled model ---------------------------------------------------------------


@pytest.mark.integration
def test_bundled_fused_fp32_equals_the_optimum_export(bundled_fp32, cache_dir, tokenizer) -> None:
    fused = prepare_model(None, "fused-fp32", cache_dir=cache_dir, progress=False)
    ids = _conversation_ids(tokenizer)
    ours = full_sequence_logits(_session(fused.onnx_path), ids)
    theirs = full_sequence_logits(_session(bundled_fp32.onnx_path), ids)
    assert np.abs(ours - theirs).max() <= 1e-4 * np.abs(theirs).max()
    assert fused.fidelity["top1_agreement"] == 1.0


@pytest.mark.integration
async def test_bundled_fused_fp32_batched_equals_alone(cache_dir, tokenizer) -> None:
    fused = prepare_model(None, "fused-fp32", cache_dir=cache_dir, progress=False)
    prompts = [chat_ids(tokenizer, text) for text in PROMPTS]
    params = SamplingParams(max_tokens=32, temperature=0)
    async with TokenGenerator(fused, prefix_cache_bytes=0) as engine:
        alone = [tokens((await collect(engine, p, params))[0]) for p in prompts]
        batched = await run_all(engine, prompts * 2, params)
    assert batched == alone * 2


@pytest.mark.integration
def test_bundled_fused_q8_meets_the_fidelity_bar(cache_dir) -> None:
    from nbresponses.models.recipes import FIDELITY_BAR

    fused = prepare_model(None, "fused-q8", cache_dir=cache_dir, progress=False)
    assert fused.fidelity["top1_agreement"] >= FIDELITY_BAR, fused.fidelity
    assert fused.fidelity["mean_kl"] < 0.05
    assert fused.size_bytes < 300e6
