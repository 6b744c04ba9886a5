"""Streamed sources (``streamed.py``, ``layered.py``): the same graph and numbers as the model
loaded whole, without ever holding it.

A Hugging Face folder of safetensors files is prepared from a skeleton whose weights are read
one at a time, and its fidelity reference and calibration run one decoder layer at a time.
Checked against ``from_pretrained(dtype=torch.float32)`` (the path GGUF files still take) for
every architecture the fused builder covers: the layered logits and calibration peaks bit for
bit, the model files byte for byte, for fp32, ``fused-q8`` and ``fused-int8`` graphs; bf16
checkpoints widened as ``from_pretrained`` widens them; folders that cannot stream loaded whole.
The reference's texts side by side (a worker per core): each text's logits bit for bit those
of the text alone, in order, the cores busy, nothing left running.
"""

from __future__ import annotations

import filecmp
import functools
import json
import threading
from pathlib import Path

import numpy as np
import pytest
from helpers.tiny_archs import ARCHITECTURES, save_tiny_model

from nbresponses.models import layered, source_model, streamed
from nbresponses.models.fused import build_fused_model, save_model
from nbresponses.models.layered import forward_all
from nbresponses.models.prepare import prepare_model
from nbresponses.models.smoothing import Smoothing, activation_peaks
from nbresponses.models.streamed import SafetensorsWeights, open_streamed


@functools.cache
def _folder(name: str, root: Path, tokenizer_dir: Path) -> Path:
    folder = root / name
    if not (folder / "config.json").is_file():
        save_tiny_model(name, folder, tokenizer_dir)
    return folder


@pytest.fixture(scope="module")
def archs_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("archs")


def _both(folder: Path):
    """(the model loaded whole, (its skeleton, the streamed weights))."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    whole = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()
    opened = open_streamed(folder, AutoConfig.from_pretrained(str(folder)))
    assert opened is not None, "a folder of fp32 safetensors streams"
    return whole, opened


def _texts(vocab: int):
    import torch

    rng = np.random.default_rng(0)
    texts = []
    for n in (7, 33, 61):  # past the tiny Gemma 3's sliding window
        ids = rng.integers(0, vocab, n).tolist()
        texts.append((ids, torch.as_tensor(np.arange(n // 3, n))))
    texts.append((rng.integers(0, vocab, 20).tolist(), 0))  # every position
    return texts


def _files(model, folder: Path, **kwargs) -> Path:
    folder.mkdir()
    graph = build_fused_model(model, weights=folder / "model.onnx.data", **kwargs)
    save_model(graph, folder / "model.onnx")
    return folder


def _same_files(a: Path, b: Path) -> bool:
    names = ("model.onnx", "model.onnx.data")
    return all(filecmp.cmp(a / n, b / n, shallow=False) for n in names)


def _alone(model, texts, tensors=None) -> list[np.ndarray]:
    """Each text's logits computed by itself, one after another, every op on one thread."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return [next(forward_all(model, [t], tensors, side_by_side=False)) for t in texts]
    finally:
        torch.set_num_threads(threads)


def test_texts_side_by_side_are_the_texts_alone(archs_root, tokenizer_dir, monkeypatch):
    """The reference's texts on two workers (whole and layer by layer): each text's logits
    bit for bit its logits alone, in the order given; two texts run at once (the first waits
    until the second has begun); PyTorch's thread count is given back."""
    import torch

    monkeypatch.setattr(layered, "physical_cores", lambda: 2)
    whole, (skeleton, tensors) = _both(_folder("qwen3", archs_root, tokenizer_dir))
    texts = _texts(whole.config.vocab_size) * 2  # 8 texts: more than the workers hold at once
    expected = _alone(whole, texts)
    callers: set[str] = set()
    calls, second, waited = iter(range(len(texts))), threading.Event(), []
    original = whole.model.forward

    def forward(*args, **kwargs):
        callers.add(threading.current_thread().name)
        call = next(calls)
        if call == 1:
            second.set()
        elif call == 0:  # one worker alone would wait here the whole timeout
            waited.append(second.wait(timeout=30))
        return original(*args, **kwargs)

    monkeypatch.setattr(whole.model, "forward", forward)
    threads = torch.get_num_threads()
    got = list(forward_all(whole, texts))
    assert waited == [True]
    assert torch.get_num_threads() == threads
    assert len(got) == len(expected)
    assert all(np.array_equal(a, b) for a, b in zip(expected, got, strict=True))
    assert callers == {"nbr-reference_0", "nbr-reference_1"}, callers
    layers = list(forward_all(skeleton, texts, tensors))
    assert all(np.array_equal(a, b) for a, b in zip(expected, layers, strict=True))
    assert torch.get_num_threads() == threads


def test_a_reference_stopped_early_runs_no_more_texts(archs_root, tokenizer_dir, monkeypatch):
    """A consumer that takes two texts of twelve and lets go: the texts not yet started never
    run, the workers are gone, PyTorch's thread count is given back."""
    import torch

    monkeypatch.setattr(layered, "physical_cores", lambda: 2)
    whole, _ = _both(_folder("qwen3", archs_root, tokenizer_dir))
    texts = _texts(whole.config.vocab_size) * 3
    runs: list[int] = []
    original = whole.model.forward

    def forward(*args, **kwargs):
        runs.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(whole.model, "forward", forward)
    threads = torch.get_num_threads()
    logits = forward_all(whole, texts)
    next(logits), next(logits)
    logits.close()
    assert 2 <= len(runs) <= 2 + (2 + 2)  # the two taken, and at most the window started ahead
    assert not [t for t in threading.enumerate() if t.name.startswith("nbr-reference")]
    assert torch.get_num_threads() == threads


@pytest.mark.slow
@pytest.mark.parametrize("name", list(ARCHITECTURES))
def test_streamed_equals_loaded_whole(name, archs_root, tokenizer_dir, tokenizer, tmp_path):
    """Logits (layer by layer against ``model(...)``), calibration peaks and the fp32, 8-bit
    MatMulNBits and integer graphs: bit for bit, byte for byte; the skeleton's weights are
    left on the meta device after each run."""
    folder = _folder(name, archs_root, tokenizer_dir)
    whole, (skeleton, tensors) = _both(folder)
    texts = _texts(whole.config.vocab_size)
    expected = list(forward_all(whole, texts))
    for _ in range(2):  # a second run finds the skeleton as the first left it
        got = list(forward_all(skeleton, texts, tensors))
        assert all(np.array_equal(a, b) for a, b in zip(expected, got, strict=True))
        assert {p.device.type for p in skeleton.parameters()} == {"meta"}
    assert [a.shape[0] for a in expected] == [7 - 2, 33 - 11, 61 - 20, 20]
    peaks = activation_peaks(whole, tokenizer)
    streamed_peaks = activation_peaks(skeleton, tokenizer, tensors=tensors)
    assert peaks.keys() == streamed_peaks.keys()
    assert all(np.array_equal(peaks[k], streamed_peaks[k]) for k in peaks)
    for label, kwargs in (
        ("fp32", {}),
        ("q8", {"bits": 8}),
        ("int8", {"integer": 8, "outliers": 4, "smoothing": Smoothing(peaks)}),
    ):
        a = _files(whole, tmp_path / f"{label}-whole", **kwargs)
        b = _files(skeleton, tmp_path / f"{label}-streamed", tensors=tensors, **kwargs)
        assert _same_files(a, b), label


def test_calibration_peaks_the_lm_heads_input_without_its_product(
    archs_root, tokenizer_dir, tokenizer, monkeypatch
):
    """The LM head's peaks are max |x| of its input, the final norm's output, which the model's
    own hidden states give independently (``output_hidden_states``); its product never runs,
    and the model is left as it was (the next forward computes every logit)."""
    import torch

    from nbresponses.models.fidelity_set import reference_spans
    from nbresponses.models.smoothing import CALIBRATION_SET

    folder = _folder("qwen3", archs_root, tokenizer_dir)
    whole, _ = _both(folder)
    head = type(whole.lm_head)
    calls = []
    original = head.forward
    monkeypatch.setattr(  # nn.Linear's: every projection's, the head's counted
        head,
        "forward",
        lambda self, x: (self is whole.lm_head and calls.append(1)) or original(self, x),
    )
    peaks = activation_peaks(whole, tokenizer)
    assert calls == []
    want = np.zeros(whole.config.hidden_size, np.float32)
    with torch.no_grad():
        for sample in CALIBRATION_SET:
            ids = torch.tensor([reference_spans(tokenizer, sample)[0]])
            final = whole(input_ids=ids, output_hidden_states=True).hidden_states[-1]
            want = np.maximum(want, final[0].abs().amax(dim=0).numpy())
    assert len(calls) == len(CALIBRATION_SET)  # the head is the model's own again
    assert np.array_equal(peaks["lm_head"], want)


@pytest.mark.slow
def test_bf16_checkpoints_widen_as_from_pretrained(tmp_path, tokenizer_dir) -> None:
    """A bf16 (or fp16) checkpoint: the same fp32 values as ``from_pretrained(dtype=float32)``
    gives, so the same graph; the skeleton's buffers in fp32 all the same."""
    import torch
    from transformers import AutoModelForCausalLM

    fp32 = _folder("qwen3", tmp_path, tokenizer_dir)
    for dtype, stored in ((torch.bfloat16, "BF16"), (torch.float16, "F16")):
        folder = tmp_path / str(dtype)
        model = AutoModelForCausalLM.from_pretrained(str(fp32), dtype=dtype)
        model.save_pretrained(str(folder))
        whole, (skeleton, tensors) = _both(folder)
        assert {kind for kind, _ in tensors.stored().values()} == {stored}
        state = whole.state_dict()
        assert set(state) == set(tensors)
        assert all(torch.equal(state[k], tensors[k]) for k in state)
        assert all(b.dtype != dtype for b in skeleton.buffers())
        a = _files(whole, tmp_path / f"{dtype}-whole", bits=8)
        b = _files(skeleton, tmp_path / f"{dtype}-streamed", bits=8, tensors=tensors)
        assert _same_files(a, b)


def test_folders_that_would_be_read_otherwise_are_loaded_whole(tmp_path, tokenizer_dir) -> None:
    """``.bin`` weights, names ``from_pretrained`` would rename, a quantized config: None
    (``SourceModel`` then loads the model whole)."""
    import torch
    from safetensors.torch import load_file, save_file
    from transformers import AutoConfig, AutoModelForCausalLM

    folder = _folder("llama3", tmp_path, tokenizer_dir)
    config = AutoConfig.from_pretrained(str(folder))
    assert open_streamed(folder, config) is not None
    model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32)
    bins = tmp_path / "bins"
    model.save_pretrained(str(bins), safe_serialization=False)
    assert open_streamed(bins, config) is None
    renamed = tmp_path / "renamed"
    model.save_pretrained(str(renamed))
    state = load_file(str(renamed / "model.safetensors"))
    state["model.norm.gamma"] = state.pop("model.norm.weight")
    save_file(state, str(renamed / "model.safetensors"), metadata={"format": "pt"})
    assert open_streamed(renamed, config) is None
    config.quantization_config = {"quant_method": "fp8"}
    assert open_streamed(folder, config) is None


def test_weights_are_read_when_asked_and_tied_ones_once(tiny_source: Path) -> None:
    import torch

    tensors = SafetensorsWeights(
        streamed.weight_files(tiny_source), {"lm_head.weight": "model.embed_tokens.weight"}
    )
    assert "lm_head.weight" in tensors and "nope" not in tensors
    assert len(tensors) == len(list(tensors)) == len(tensors.stored()) + 1
    head, embed = tensors["lm_head.weight"], tensors["model.embed_tokens.weight"]
    assert torch.equal(head, embed) and head.data_ptr() != embed.data_ptr()  # nothing cached


@pytest.mark.slow
def test_prepare_streams_a_folder_with_the_fidelity_of_the_whole_model(
    tiny_source: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``fused-q8`` and ``fused-int8`` prepared from the tiny folder without loading the model
    whole: the same files and the same fidelity report as with the model loaded whole."""
    from nbresponses.models import fused

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("the model was loaded whole")

    with monkeypatch.context() as patch:
        patch.setattr(fused, "load_source_model", refuse)
        patch.setattr(source_model, "load_source_model", refuse)
        streamed_models = {
            r: prepare_model(tiny_source, r, cache_dir=tmp_path / "streamed", progress=False)
            for r in ("fused-q8", "fused-int8")
        }
    with monkeypatch.context() as patch:
        patch.setattr(source_model, "open_streamed", lambda *a, **k: None)
        for recipe, streamed_model in streamed_models.items():
            whole = prepare_model(tiny_source, recipe, cache_dir=tmp_path / "whole", progress=False)
            assert _same_files(whole.path, streamed_model.path), recipe
            for name in ("config.json", "generation_config.json", "tokenizer.json"):
                assert (whole.path / name).read_text() == (streamed_model.path / name).read_text()
            assert whole.fidelity == streamed_model.fidelity
            assert whole.fidelity["reference"] == "PyTorch fp32"
            manifest = json.loads((streamed_model.path / "manifest.json").read_text())
            assert manifest["fidelity"]["tokens"] > 1000
