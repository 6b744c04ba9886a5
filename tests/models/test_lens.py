"""The logit lens graph against PyTorch's ``output_hidden_states`` (fp32): the tiny Llama through
the ``fused-fp32`` recipe, and every tiny architecture of ``helpers.tiny_archs``."""

from __future__ import annotations

import numpy as np
import pytest
from helpers.engine import PROMPTS, chat_ids
from helpers.tiny_archs import ARCHITECTURES, build_tiny_model, prepare_tiny

from nbresponses.models.fused import build_fused_model
from nbresponses.models.lens import LENS_FILE, TOP_K, LensUnsupported, build_lens_graph
from nbresponses.runtime.kv import KVBuffer
from nbresponses.runtime.lens import LogitLens


def _torch_lens(model, ids: list[int]) -> np.ndarray:
    """PyTorch's lens, independent of the graph: log_softmax of the model's own LM head (and
    Gemma's final soft cap) after its own final norm, for every hidden state transformers
    reports, [L+1, S, V]. transformers' last hidden state is already normed: its lens is the
    model's logits (checked here, with the cap: the forward applies it so)."""
    import torch

    cap = getattr(model.config, "final_logit_softcapping", None)

    def head(normed):
        logits = model.lm_head(normed)
        return logits if cap is None else torch.tanh(logits / cap) * cap

    with torch.no_grad():
        out = model(torch.tensor([ids]), output_hidden_states=True)
        states = out.hidden_states
        assert len(states) == model.config.num_hidden_layers + 1
        torch.testing.assert_close(head(states[-1]), out.logits, rtol=0, atol=0)
        rows = [head(model.model.norm(h))[0] for h in states[:-1]] + [out.logits[0]]
        return torch.log_softmax(torch.stack(rows).double(), -1).numpy()


def _check_lens(result, reference: np.ndarray, ids: list[int]) -> dict[str, tuple]:
    """The lens against PyTorch's: top-10 tokens and logprobs, the next token's logprob and
    rank, KL(final || layer), within 1e-4 (fp32 rounding in another summation order). Returns
    the largest differences seen (absolute, and as a share of the tolerance), and the ranks
    that differ from PyTorch's (with how many positions have a tie within 1e-4)."""
    layers, count = reference.shape[:2]
    assert result.top_ids.shape == (layers, count, TOP_K)
    # top tokens and their logprobs: each is among PyTorch's top 10 (ties within rounding)
    expected_top = np.take_along_axis(reference, result.top_ids, axis=-1)
    np.testing.assert_allclose(result.top_logprobs, expected_top, rtol=1e-4, atol=1e-4)
    tenth = np.sort(reference, axis=-1)[..., -TOP_K]
    assert (expected_top >= tenth[..., None] - 1e-4).all()
    ordered = np.sort(reference, axis=-1)[..., ::-1][..., :TOP_K]
    np.testing.assert_allclose(result.top_logprobs, ordered, rtol=1e-4, atol=1e-4)
    clear = ordered[..., 0] - ordered[..., 1] > 1e-4  # PyTorch's top token, where not a tie
    assert (result.top_ids[..., 0] == reference.argmax(-1))[clear].all()
    # the next token's logprob and rank, at every position but the last
    nxt = np.array(ids[1:])
    want = np.take_along_axis(reference[:, :-1], nxt[None, :, None].repeat(layers, 0), -1)[..., 0]
    np.testing.assert_allclose(result.next_logprob[:, :-1], want, rtol=1e-4, atol=1e-4)
    assert np.isnan(result.next_logprob[:, -1]).all()
    ranks = 1 + (reference[:, :-1] > want[..., None]).sum(-1)
    # where other tokens are within rounding (1e-4) of the next one, either order is right
    surely_above = (reference[:, :-1] > want[..., None] + 1e-4).sum(-1)
    at_or_near = (reference[:, :-1] > want[..., None] - 1e-4).sum(-1)  # the token itself too
    ours = result.next_rank[:, :-1]
    assert ((ours >= 1 + surely_above) & (ours <= at_or_near)).all()
    assert (ours == ranks).mean() > 0.95
    # KL(final || layer): zero at the last layer
    final = reference[-1]
    kl = (np.exp(final)[None] * (final[None] - reference)).sum(-1)
    np.testing.assert_allclose(result.kl, kl, rtol=1e-4, atol=1e-4)
    assert np.abs(result.kl[-1]).max() < 1e-5

    def worst(ours: np.ndarray, theirs: np.ndarray) -> tuple[float, float]:
        """(the largest |difference|, the largest share of the tolerance it uses)"""
        diff = np.abs(ours - theirs)
        return float(diff.max()), float((diff / (1e-4 + 1e-4 * np.abs(theirs))).max())

    return {
        "top_logprobs": worst(result.top_logprobs, ordered),
        "next_logprob": worst(result.next_logprob[:, :-1], want),
        "kl": worst(result.kl, kl),
        "rank_mismatches": (int((ours != ranks).sum()), int((at_or_near > 1 + surely_above).sum())),
    }


@pytest.mark.slow
def test_the_lens_equals_pytorch(tiny_fused, tiny_source, tokenizer):
    """The tiny Llama through ``prepare_model``'s own ``fused-fp32`` recipe."""
    from transformers import AutoModelForCausalLM

    ids = chat_ids(tokenizer, PROMPTS[4])[:40]
    result = LogitLens(tiny_fused.path, threads=2).run(ids)
    assert (tiny_fused.path / LENS_FILE).is_file()
    model = AutoModelForCausalLM.from_pretrained(str(tiny_source), dtype="float32").eval()
    reference = _torch_lens(model, ids)
    assert reference.shape[0] == 3  # embeddings + 2 layers
    _check_lens(result, reference, ids)


@pytest.mark.slow
@pytest.mark.parametrize("name", list(ARCHITECTURES))
def test_every_architecture_equals_pytorch(name, tokenizer, tmp_path):
    """Each tiny architecture's ``fused-fp32`` graph (Gemma 3: (1 + w) norms, scaled
    embeddings, the final soft cap; Phi-3/4: packed weights, partial rotary, untied/tied
    heads; SmolLM3: layers without rotary): its lens is PyTorch's, at every layer."""
    special = {"eos_token_id": tokenizer.eos_token_id, "pad_token_id": tokenizer.pad_token_id}
    model = build_tiny_model(name, len(tokenizer), special_ids=special)
    prepared = prepare_tiny(
        model, build_fused_model(model), tmp_path / name, tokenizer, "fused-fp32"
    )
    ids = chat_ids(tokenizer, PROMPTS[4])[:40]  # well past Gemma 3's sliding window
    result = LogitLens(prepared.path, threads=2).run(ids)
    reference = _torch_lens(model, ids)
    assert reference.shape[0] == model.config.num_hidden_layers + 1
    worst = _check_lens(result, reference, ids)
    print(name, worst)  # the differences, with -s


def test_an_optimum_graph_is_refused(tiny_model):
    import onnx

    proto = onnx.load(str(tiny_model.onnx_path), load_external_data=False)
    with pytest.raises(LensUnsupported, match="fused"):
        build_lens_graph(proto)


async def test_the_engine_lens_frame_and_heat_map(tiny_fused, tokenizer):
    """``Engine.logit_lens``: a frame whose last layer is the model's own distribution (the
    logprobs ``score`` gives the same tokens), and its heat map."""
    from nbresponses.engine import Engine
    from nbresponses.frames import LENS_COLUMNS, logprobs_frame, plot_lens
    from nbresponses.runtime.generator import TokenGenerator

    text = "The capital of France is Paris."
    async with Engine(TokenGenerator(tiny_fused, tokenizer=tokenizer), store_path="memory") as e:
        frame = await e.logit_lens(text)
        scored = logprobs_frame(await e.score(text, method="prefill"))
    assert {k: str(v) for k, v in frame.dtypes.items()} == LENS_COLUMNS
    count = len(scored) + 1  # the document-start token, then the text's tokens
    assert len(frame) == 3 * count and frame["layer"].max() == 2
    last = frame[frame["layer"] == 2].iloc[:-1]
    assert last["next_token"].tolist() == scored["token"].astype(str).tolist()
    np.testing.assert_allclose(last["next_logprob"], scored["logprob"], atol=1e-5)
    assert (last["next_rank"].to_numpy() == scored["rank"].to_numpy()).all()
    assert np.abs(frame.loc[frame["layer"] == 2, "kl"]).max() < 1e-5
    assert frame["next_prob"].iloc[count - 1] != frame["next_prob"].iloc[count - 1]  # NaN: last
    html = plot_lens(frame).to_html()
    assert (
        html.count("<td ") == 3 * count and "background-color: #" in html and "logit lens" in html
    )
    assert "Paris" in html


@pytest.mark.parametrize(
    ("attention", "values"), [("ops", None), ("kernel", None), ("kernel", "int8")]
)
def test_a_float16_kv_graph_has_a_lens(tokenizer, tmp_path, attention, values):
    """``fused-int8``'s graphs keep their KV in float16: the lens feeds buffers of that type,
    and its last layer is the graph's own next-token distribution; with our attention operator
    too, and with its values in int8 (``fused-int8-kernel``)."""
    import onnxruntime as ort

    from nbresponses.models import kernels

    special = {"eos_token_id": tokenizer.eos_token_id, "pad_token_id": tokenizer.pad_token_id}
    model = build_tiny_model("llama3", len(tokenizer), special_ids=special)
    graph = build_fused_model(model, kv_dtype="float16", attention=attention, value_dtype=values)
    prepared = prepare_tiny(model, graph, tmp_path / "half", tokenizer, "fused-fp32")
    ids = chat_ids(tokenizer, PROMPTS[0])[:24]
    result = LogitLens(prepared.path, threads=2).run(ids)
    options = kernels.for_model(ort.SessionOptions(), prepared.onnx_path)
    session = ort.InferenceSession(
        str(prepared.onnx_path), options, providers=["CPUExecutionProvider"]
    )
    pasts = {
        i.name: KVBuffer.of_input(i).zeros(len(ids), 1)
        for i in session.get_inputs()
        if i.name.startswith("past_key_values")
    }
    (logits,) = session.run(
        ["logits"],
        {
            "input_ids": np.array([ids], np.int64),
            "position_ids": np.arange(len(ids), dtype=np.int64)[None],
            "num_logits_to_keep": np.zeros(1, np.int64),
            **pasts,
        },
    )
    own = logits[0].astype(np.float64)
    own -= own.max(-1, keepdims=True)
    own -= np.log(np.exp(own).sum(-1, keepdims=True))
    expected = own[np.arange(len(ids) - 1), ids[1:]]
    np.testing.assert_allclose(result.next_logprob[-1, :-1], expected, atol=1e-5)
