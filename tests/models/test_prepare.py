"""Model preparation: sources, export, recipes, fidelity maths, cache atomicity and locking."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import onnx
import pytest
from helpers.paths import ROOT

from nbresponses.models.errors import ModelSourceError, RecipeError
from nbresponses.models.fidelity import compare_logits, log_softmax
from nbresponses.models.prepare import prepare_model
from nbresponses.models.prepared import list_models
from nbresponses.models.recipes import AUTO_ORDER, FIDELITY_BAR, RECIPES
from nbresponses.models.sources import BUNDLED_ALIAS, resolve_source


def _entries(cache: Path, kind: str = "models") -> list[Path]:
    folder = cache / kind
    return sorted(p for p in folder.glob("*") if p.is_dir()) if folder.exists() else []


# --- sources and bad input ----------------------------------------------------------------


def test_unknown_model_lists_what_is_accepted() -> None:
    with pytest.raises(ModelSourceError, match=r"no such file or folder.*Accepted:.*\.gguf"):
        resolve_source("no-such-model")


def test_hub_id_offline_names_the_bundled_model() -> None:
    with pytest.raises(ModelSourceError, match=BUNDLED_ALIAS):
        resolve_source("SomeOrg/not-in-any-cache", offline=True)


def test_non_gguf_file_and_empty_folder_are_refused(tmp_path: Path) -> None:
    (tmp_path / "weights.bin").write_bytes(b"x")
    with pytest.raises(ModelSourceError, match=r"not a \.gguf"):
        resolve_source(tmp_path / "weights.bin")
    with pytest.raises(ModelSourceError, match=r"without config\.json"):
        resolve_source(tmp_path)


def test_unknown_recipe_lists_recipes(tiny_source: Path, tmp_path: Path) -> None:
    with pytest.raises(RecipeError, match=r"'q8'.*'q4'"):
        prepare_model(tiny_source, "int3", cache_dir=tmp_path, progress=False)
    assert not _entries(tmp_path, "exports"), "an unknown recipe must fail before any work"


def test_corrupt_gguf_caches_nothing(tmp_path: Path) -> None:
    bad = tmp_path / "src" / "broken.gguf"
    bad.parent.mkdir()
    bad.write_bytes(b"GGUF" + os.urandom(4096))
    cache = tmp_path / "cache"
    with pytest.raises(ModelSourceError, match=r"tokenizer|could not be loaded"):
        prepare_model(bad, "fp32", cache_dir=cache, progress=False)
    assert not _entries(cache, "exports") and not _entries(cache, "models")
    assert not list((cache / "tmp").iterdir())


def test_non_llm_folder_caches_nothing(tmp_path: Path) -> None:
    src = tmp_path / "bert"
    src.mkdir()
    (src / "config.json").write_text(json.dumps({"architectures": ["BertModel"]}))
    (src / "tokenizer_config.json").write_text("{}")
    cache = tmp_path / "cache"
    with pytest.raises(ModelSourceError):
        prepare_model(src, "fp32", cache_dir=cache, progress=False)
    assert not _entries(cache, "exports") and not _entries(cache, "models")


def test_bundled_tokenizer_is_repaired(tokenizer) -> None:
    assert tokenizer.eos_token == tokenizer.pad_token == "<|im_end|>"
    assert tokenizer("hi")["input_ids"][0] != tokenizer.convert_tokens_to_ids("<|im_start|>")
    text = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False)
    ids = tokenizer(text)["input_ids"]
    start = tokenizer.convert_tokens_to_ids("<|im_start|>")
    assert ids[0] == start and ids[1] != start, "prompt must not start with <|im_start|> twice"


# --- recipes and fidelity ------------------------------------------------------------------


def test_fidelity_maths_by_hand() -> None:
    ref = np.log(np.array([[0.7, 0.2, 0.1], [0.1, 0.1, 0.8]]))
    same = compare_logits(ref, ref + 5.0, np.array([0, 2]))  # logits shift: same distribution
    assert same.top1_agreement == 1.0 and same.mean_kl == pytest.approx(0.0, abs=1e-12)
    assert same.max_abs_dlogprob == pytest.approx(0.0, abs=1e-12)
    cand = np.log(np.array([[0.2, 0.7, 0.1], [0.1, 0.1, 0.8]]))
    rep = compare_logits(ref, cand, np.array([0, 2]))
    kl_row0 = 0.7 * np.log(0.7 / 0.2) + 0.2 * np.log(0.2 / 0.7)
    assert rep.top1_agreement == 0.5
    assert rep.mean_kl == pytest.approx(kl_row0 / 2)
    assert rep.max_abs_dlogprob == pytest.approx(abs(np.log(0.7) - np.log(0.2)))
    assert rep.mean_abs_dlogprob == pytest.approx(abs(np.log(0.7) - np.log(0.2)) / 2)
    assert np.allclose(np.exp(log_softmax(np.array([1.0, 2.0, 3.0]))).sum(), 1.0)


@pytest.mark.slow
@pytest.mark.parametrize("recipe", sorted(RECIPES))
def test_every_recipe_prepares_runs_and_is_measured(recipe: str, tiny_source: Path, cache_dir):
    import onnxruntime as ort

    from nbresponses.models import kernels
    from nbresponses.models.fidelity import full_sequence_logits

    prepared = prepare_model(tiny_source, recipe, cache_dir=cache_dir, progress=False)
    manifest = prepared.manifest
    assert prepared.recipe == recipe and manifest["source"]["kind"] == "folder"
    for key in ("versions", "cpu", "timings", "size_bytes", "fidelity", "key", "created"):
        assert key in manifest, key
    assert manifest["versions"]["onnxruntime"] and manifest["cpu"]["flags"] is not None
    fid = prepared.fidelity
    assert fid["tokens"] > 200, "the built-in text gives a few hundred scored tokens"
    assert 0.0 <= fid["top1_agreement"] <= 1.0 and fid["mean_kl"] >= 0.0
    if recipe == "fp32":
        assert fid["top1_agreement"] == 1.0 and fid["max_abs_dlogprob"] == 0.0
    else:
        assert fid["mean_kl"] > 0.0, "a quantized model cannot be bit-identical to fp32"
    options = kernels.for_model(ort.SessionOptions(), prepared.onnx_path)  # fused-*-kernel
    session = ort.InferenceSession(
        str(prepared.onnx_path), options, providers=["CPUExecutionProvider"]
    )
    logits = full_sequence_logits(session, [1, 2, 3, 4])
    assert logits.shape == (4, prepared.config["vocab_size"]) and np.isfinite(logits).all()
    assert prepared.load_tokenizer().eos_token == "<|im_end|>"


@pytest.mark.slow
def test_fused_recipes_are_built_from_the_source_without_an_export(
    tiny_source: Path, tmp_path: Path
) -> None:
    prepared = prepare_model(tiny_source, "fused-q8", cache_dir=tmp_path, progress=False)
    assert not _entries(tmp_path, "exports"), "no Optimum export for a fused recipe"
    names = {p.name for p in prepared.path.iterdir()}
    assert {"model.onnx", "model.onnx.data", "config.json", "generation_config.json"} <= names
    assert {"tokenizer.json", "tokenizer_config.json", "chat_template.jinja"} <= names
    assert "_reference" not in names and not list((tmp_path / "tmp").iterdir())
    assert prepared.size_bytes == sum(
        (prepared.path / n).stat().st_size for n in ("model.onnx", "model.onnx.data")
    )
    assert prepared.fidelity["reference"] == "PyTorch fp32"
    assert set(prepared.manifest["timings"]) == {"load", "quantize", "evaluate"}
    fp32 = prepare_model(tiny_source, "fused-fp32", cache_dir=tmp_path, progress=False)
    assert fp32.fidelity["reference"] == "PyTorch fp32"
    assert fp32.fidelity["top1_agreement"] == 1.0 and fp32.fidelity["max_abs_dlogprob"] < 1e-3
    # what the engine reads beside the model is what the export path writes
    export = prepare_model(tiny_source, "q8", cache_dir=tmp_path, progress=False)
    for name in ("config.json", "generation_config.json", "tokenizer.json", "chat_template.jinja"):
        assert (prepared.path / name).read_text() == (export.path / name).read_text(), name


def test_a_prepared_model_loads_without_reading_its_source(
    tiny_source: Path, cache_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Loading a prepared model reads its folder only: no tokenizer or weights from the
    source, no transformers tokenizer (reading one out of a GGUF file takes ~9 s)."""
    from nbresponses.models import export, fused, source_model
    from nbresponses.runtime.generator import TokenGenerator

    prepared = prepare_model(tiny_source, "fused-q8", cache_dir=cache_dir, progress=False)

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("the source was read")

    monkeypatch.setattr(export, "load_tokenizer", refuse)
    monkeypatch.setattr(source_model, "load_tokenizer", refuse)
    monkeypatch.setattr(fused, "load_source_model", refuse)
    monkeypatch.setattr("transformers.AutoTokenizer.from_pretrained", refuse)
    again = prepare_model(tiny_source, "fused-q8", cache_dir=cache_dir, progress=False)
    assert again.path == prepared.path
    generator = TokenGenerator(again)
    assert generator.tokenizer.encode("Hello") and generator.eos_token_ids


def _logits_producer(path: Path) -> tuple[str, list[str]]:
    model = onnx.load(str(path), load_external_data=False)
    node = next(n for n in model.graph.node if "logits" in n.output)
    return node.op_type, list(node.input)


def test_q8_quantizes_the_untied_head_and_q8_fp32_head_keeps_it(tiny_source, cache_dir) -> None:
    q8 = prepare_model(tiny_source, "q8", cache_dir=cache_dir, progress=False)
    kept = prepare_model(tiny_source, "q8-fp32-head", cache_dir=cache_dir, progress=False)
    assert _logits_producer(q8.onnx_path)[0] == "MatMulNBits"
    assert _logits_producer(kept.onnx_path)[0] == "MatMul"
    ops = {n.op_type for n in onnx.load(str(kept.onnx_path)).graph.node}
    assert "MatMulNBits" in ops, "the body's matmuls are quantized in both"


@pytest.mark.slow
def test_preparing_does_not_change_the_users_logging(tiny_source: Path, tmp_path: Path) -> None:
    root = logging.getLogger()
    before = (root.level, list(root.handlers))
    prepare_model(tiny_source, "q4", cache_dir=tmp_path, progress=False)
    assert (root.level, list(root.handlers)) == before


# --- cache ---------------------------------------------------------------------------------


@pytest.mark.slow
def test_cache_hits_and_invalidation(tiny_source: Path, tmp_path: Path, tokenizer_dir) -> None:
    from helpers.tiny_model import build_tiny_llama

    first = prepare_model(tiny_source, "fp32", cache_dir=tmp_path, progress=False)
    stamp = (first.path / "manifest.json").stat().st_mtime_ns
    again = prepare_model(tiny_source, "fp32", cache_dir=tmp_path, progress=False)
    assert again.path == first.path
    assert (again.path / "manifest.json").stat().st_mtime_ns == stamp, "cached, not rebuilt"
    other_recipe = prepare_model(tiny_source, "q8", cache_dir=tmp_path, progress=False)
    assert other_recipe.path != first.path
    changed = build_tiny_llama(tmp_path / "changed", tokenizer_dir, seed=1)
    (changed / "config.json").rename(changed / "config.json.tmp")
    (changed / "config.json.tmp").rename(changed / "config.json")
    import shutil

    shutil.copytree(changed, tmp_path / "src-copy")
    rebuilt = prepare_model(tmp_path / "src-copy", "fp32", cache_dir=tmp_path, progress=False)
    assert rebuilt.manifest["source"]["content_hash"] != first.manifest["source"]["content_hash"]
    assert rebuilt.path != first.path
    assert {m.path for m in list_models(tmp_path)} == {first.path, other_recipe.path, rebuilt.path}
    # an already prepared folder is a source too
    assert prepare_model(first.path, cache_dir=tmp_path, progress=False).path == first.path


PREPARE_SCRIPT = (
    "import sys; from nbresponses.models.prepare import prepare_model; "
    "m = prepare_model(sys.argv[1], sys.argv[2], cache_dir=sys.argv[3], progress=False); "
    "print('PATH', m.path)"
)


def _prepare_process(source: Path, recipe: str, cache: Path) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen(
        [sys.executable, "-c", PREPARE_SCRIPT, str(source), recipe, str(cache)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


@pytest.mark.slow
def test_two_concurrent_prepares_share_one_build(tiny_source: Path, tmp_path: Path) -> None:
    procs = [_prepare_process(tiny_source, "q8", tmp_path) for _ in range(2)]
    outputs = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), [err[-2000:] for _, err in outputs]
    paths = {line for out, _ in outputs for line in out.splitlines() if line.startswith("PATH")}
    assert len(paths) == 1, paths
    assert len(_entries(tmp_path, "exports")) == 1 and len(_entries(tmp_path, "models")) == 1
    assert not list((tmp_path / "tmp").iterdir()), "no temporary folders left behind"
    manifest = json.loads((_entries(tmp_path)[0] / "manifest.json").read_text())
    assert manifest["recipe"]["name"] == "q8"


@pytest.mark.slow
def test_killed_prepare_leaves_nothing_half_written(tiny_source: Path, tmp_path: Path) -> None:
    proc = _prepare_process(tiny_source, "q4", tmp_path)
    deadline = time.monotonic() + 120
    try:
        while time.monotonic() < deadline:  # kill it while it is writing a temporary folder
            scratch = tmp_path / "tmp"
            if scratch.exists() and any(p.is_dir() and any(p.iterdir()) for p in scratch.iterdir()):
                break
            if proc.poll() is not None:
                pytest.fail("prepare finished before it could be killed")
            time.sleep(0.02)
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.wait()
    assert proc.returncode == -signal.SIGKILL
    assert not any((p / "manifest.json").exists() for p in _entries(tmp_path, "models"))
    assert not _entries(tmp_path, "models") or all(
        not (p / "manifest.json").exists() for p in _entries(tmp_path, "models")
    )
    assert list((tmp_path / "tmp").iterdir()), "the killed build's scratch folder is still there"
    prepared = prepare_model(tiny_source, "q4", cache_dir=tmp_path, progress=False)
    assert prepared.recipe == "q4"
    assert not list((tmp_path / "tmp").iterdir()), "the next prepare cleans the leftovers"


# --- the real bundled model ---------------------------------------------------------------


@pytest.mark.integration
def test_bundled_model_default_recipe_meets_the_bar(bundled_model, cache_dir) -> None:
    assert bundled_model.manifest["source"]["kind"] == "bundled"
    # fused-int8-kernel where the CPU has VNNI and our operators build (make test installs
    # what they need), else fused-q8
    assert bundled_model.recipe == AUTO_ORDER[0]
    fid = bundled_model.fidelity
    assert fid["top1_agreement"] >= FIDELITY_BAR, fid
    assert fid["mean_kl"] < 0.05 and fid["tokens"] > 200
    assert bundled_model.size_bytes < 300e6  # 8-bit: about half of fp32's 539 MB
    assert bundled_model.path in {m.path for m in list_models(cache_dir)}
    tokenizer = bundled_model.load_tokenizer()
    assert tokenizer.eos_token == "<|im_end|>"


@pytest.mark.integration
def test_the_bundled_model_loads_without_reading_the_gguf(
    bundled_model, cache_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The prepared bundled model's tokenizer and chat template come from its folder: the
    GGUF file's tokenizer path (and any GGUF reading) fails here, and loading still works."""
    import gguf

    from nbresponses.models import export
    from nbresponses.runtime.generator import TokenGenerator

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("the GGUF file was read")

    monkeypatch.setattr(export, "load_tokenizer", refuse)
    monkeypatch.setattr(gguf, "GGUFReader", refuse)
    monkeypatch.setattr("transformers.AutoTokenizer.from_pretrained", refuse)
    prepared = prepare_model(None, cache_dir=cache_dir, progress=False)
    assert prepared.path == bundled_model.path
    generator = TokenGenerator(prepared)
    tokenizer = generator.tokenizer
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Hi"}], add_generation_prompt=True
    )
    assert tokenizer.decode(prompt).startswith("<|im_start|>system")
    assert generator.eos_token_ids[0] == tokenizer.convert_tokens_to_ids("<|im_end|>")


@pytest.mark.slow
def test_a_failing_build_leaves_no_entry(tiny_source: Path, tmp_path: Path, monkeypatch) -> None:
    """A full disk (or any error) while quantizing: the error propagates, nothing is cached."""
    import errno

    from nbresponses.models import recipes

    def no_space(source: Path, target: Path) -> None:
        target.write_bytes(b"partial")
        raise OSError(errno.ENOSPC, "No space left on device")

    broken = recipes.Recipe("q4", "broken", no_space, RECIPES["q4"].params)
    monkeypatch.setitem(recipes.RECIPES, "q4", broken)
    with pytest.raises(OSError, match="No space"):
        prepare_model(tiny_source, "q4", cache_dir=tmp_path, progress=False)
    assert not _entries(tmp_path, "models")
    assert not list((tmp_path / "tmp").iterdir())


def test_a_cached_model_shows_no_progress_bar(tiny_model, tiny_source, cache_dir, capsys) -> None:
    capsys.readouterr()
    again = prepare_model(tiny_source, "fp32", cache_dir=cache_dir, progress=True)
    assert again.path == tiny_model.path
    assert "prepare" not in capsys.readouterr().err, "nothing to do: no bar"
