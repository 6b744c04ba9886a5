"""The logit lens graph against PyTorch's ``output_hidden_states`` on the tiny model (fp32)."""

from __future__ import annotations

import numpy as np
import pytest
from helpers.engine import PROMPTS, chat_ids

from nbresponses.models.lens import LENS_FILE, TOP_K, LensUnsupported, build_lens_graph
from nbresponses.models.prepare import prepare_model
from nbresponses.runtime.lens import LogitLens


@pytest.fixture(scope="module")
def tiny_fused(tiny_source, cache_dir):
    return prepare_model(tiny_source, "fused-fp32", cache_dir=cache_dir, progress=False)


def _torch_lens(source, ids: list[int]) -> np.ndarray:
    """log_softmax(lm_head(final_norm(h_l))) for every hidden state PyTorch reports, [L+1, S, V]
    (transformers' last hidden state is already normed: its lens is the model's logits)."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(source), dtype=torch.float32).eval()
    with torch.no_grad():
        out = model(torch.tensor([ids]), output_hidden_states=True)
        states = out.hidden_states
        rows = [model.lm_head(model.model.norm(h))[0] for h in states[:-1]] + [out.logits[0]]
        return torch.log_softmax(torch.stack(rows).double(), -1).numpy()


def test_the_lens_equals_pytorch(tiny_fused, tiny_source, tokenizer):
    ids = chat_ids(tokenizer, PROMPTS[4])[:40]
    result = LogitLens(tiny_fused.path, threads=2).run(ids)
    assert (tiny_fused.path / LENS_FILE).is_file()
    reference = _torch_lens(tiny_source, ids)
    layers, count = reference.shape[:2]
    assert result.top_ids.shape == (layers, count, TOP_K) and layers == 3  # embeddings + 2 layers
    # top tokens and their logprobs
    expected_top = np.take_along_axis(reference, result.top_ids, axis=-1)
    np.testing.assert_allclose(result.top_logprobs, expected_top, rtol=1e-4, atol=1e-4)
    best = reference.max(axis=-1)
    np.testing.assert_allclose(result.top_logprobs[..., 0], best, rtol=1e-4, atol=1e-4)
    # the next token's logprob and rank, at every position but the last
    nxt = np.array(ids[1:])
    want = np.take_along_axis(reference[:, :-1], nxt[None, :, None].repeat(layers, 0), -1)[..., 0]
    np.testing.assert_allclose(result.next_logprob[:, :-1], want, rtol=1e-4, atol=1e-4)
    assert np.isnan(result.next_logprob[:, -1]).all()
    ranks = 1 + (reference[:, :-1] > want[..., None]).sum(-1)
    assert (np.abs(result.next_rank[:, :-1] - ranks) <= 1).all()  # ties within fp32 rounding
    assert (result.next_rank[:, :-1] == ranks).mean() > 0.95
    # KL(final || layer): zero at the last layer
    final = reference[-1]
    kl = (np.exp(final)[None] * (final[None] - reference)).sum(-1)
    np.testing.assert_allclose(result.kl, kl, rtol=1e-4, atol=1e-4)
    assert np.abs(result.kl[-1]).max() < 1e-5


def test_an_optimum_graph_is_refused(tiny_model):
    import onnx

    proto = onnx.load(str(tiny_model.onnx_path), load_external_data=False)
    with pytest.raises(LensUnsupported, match="fused"):
        build_lens_graph(proto)


async def test_the_engine_lens_frame_and_heat_map(tiny_fused, tokenizer):
    """``Engine.logit_lens``: a frame whose last layer is the model's own distribution (the
    logprobs ``score`` gives the same tokens), and its heat map."""
    from nbresponses.engine import Engine
    from nbresponses.frames import LENS_COLUMNS, lens_heatmap, logprobs_frame
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
    html = lens_heatmap(frame).to_html()
    assert (
        html.count("<td ") == 3 * count and "background-color: #" in html and "logit lens" in html
    )
    assert "Paris" in html
