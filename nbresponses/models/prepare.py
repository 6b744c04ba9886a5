"""One call from a model name to a fast, faithful, cached ONNX model with a fidelity report."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import time
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Any

from nbresponses._extras import require
from nbresponses.models.cache import (
    build_once,
    cache_root,
    folder_size,
    is_complete,
    write_manifest,
)
from nbresponses.models.cpu import cpu_features
from nbresponses.models.errors import RecipeError
from nbresponses.models.export import (
    export_onnx,
    load_tokenizer,
    materialize_hf_folder,
    quiet_export,
)
from nbresponses.models.fidelity import measure_fidelity
from nbresponses.models.fused import UnsupportedArchitecture
from nbresponses.models.gguf_once import parsed_once
from nbresponses.models.heap import trim_heap
from nbresponses.models.kernels import KernelsUnavailable
from nbresponses.models.prepared import PreparedModel
from nbresponses.models.progress import Stages, quiet_library_bars
from nbresponses.models.recipes import (
    ALIASES,
    AUTO,
    FIDELITY_BAR,
    MODEL_FILE,
    Recipe,
    get_recipe,
)
from nbresponses.models.source_model import REFERENCE, SourceModel
from nbresponses.models.sources import ModelSource, resolve_source

# Bump when the export (EXPORT_VERSION) or a recipe or the fidelity measure (PREPARE_VERSION)
# changes in a way that invalidates cached files. 2: the broad fidelity set, end-padded graphs.
# 3: fused recipes built from the source's weights without the export, quantized as built,
# measured against PyTorch fp32.
EXPORT_VERSION = 1
# 4: the fused graph's attention from standard operators (one computation for every step shape).
# 5: that attention as one product per KV head (all positions' queries as its rows); the
# integer products' outlier split through a mask, not a Gather.
# 6: the integer products' rows quantized by one blocked QuantizeLinear; outlier channels in fp32.
PREPARE_VERSION = 6
_VERSIONED = (
    "nbresponses",
    "onnxruntime",
    "optimum",
    "optimum-onnx",
    "transformers",
    "torch",
    "onnx",
)


def library_versions() -> dict[str, str]:
    versions = {}
    for name in _VERSIONED:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = "not installed"
    return versions


def _key(*parts: object) -> str:
    return hashlib.sha256("\0".join(map(str, parts)).encode()).hexdigest()[:12]


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def prepare_model(
    model: str | os.PathLike[str] | None = None,
    quantization: str | None = None,
    *,
    cache_dir: str | os.PathLike[str] | None = None,
    progress: bool = True,
    offline: bool | None = None,
) -> PreparedModel:
    """Resolve, export (Optimum), quantize and evaluate ``model``; cached after the first call.

    ``quantization`` is a recipe name (see ``nbresponses.models.recipes.RECIPES``), ``"auto"``
    (default: the fastest recipe whose top-1 agreement with fp32 is at least 95%) or
    ``"analysis"`` (fp32 weights in the fastest graph that runs them: logprobs for analysis).
    """
    recipe_name = quantization or AUTO
    if recipe_name not in ALIASES:
        get_recipe(recipe_name)  # fail fast, before any expensive work
    source = resolve_source(model, offline=offline)
    if source.kind == "prepared":
        prepared = PreparedModel.open(source.path)
        if recipe_name != prepared.recipe and prepared.recipe not in ALIASES.get(recipe_name, ()):
            raise RecipeError(
                f"{source.path} is already prepared with recipe {prepared.recipe!r}; "
                f"quantization={recipe_name!r} needs the original model as the source"
            )
        return prepared

    root = cache_root(cache_dir)
    export_dir = root / "exports" / f"{source.name}-{_key(source.content_hash, EXPORT_VERSION)}"
    candidates = ALIASES.get(recipe_name, (recipe_name,))
    # Already prepared: no progress bar at all (a bar that flashes 0/3 in every notebook misleads).
    # Otherwise one bar, one step per stage (load, [export,] quantize, evaluate); the libraries'
    # own bars (transformers' GGUF de-quantization, ...) stay off: nested bars tangle.
    cached = is_complete(_recipe_dir(source, candidates[0], root))
    if not cached:
        _require_export(source)  # before any bar: running a prepared model needs no torch
    weights = SourceModel(source)  # loaded on first use, once, by the recipes built from it
    stages = Stages(
        f"prepare {source.name}",
        _stages(get_recipe(candidates[0]), export_dir, weights),
        enabled=progress and not cached,
    )
    finished = False
    with contextlib.nullcontext() if cached else quiet_library_bars():
        try:
            for index, name in enumerate(candidates):
                recipe = get_recipe(name)
                if index:  # the next, more faithful recipe
                    stages.extend(_stages(recipe, export_dir, weights))
                try:
                    prepared = _prepare_recipe(source, export_dir, name, root, stages, weights)
                except (UnsupportedArchitecture, KernelsUnavailable):
                    if recipe_name not in ALIASES:
                        raise
                    # a fused recipe on a model its builder does not cover, or our operators
                    # failing to build here: the next one
                    continue
                if (
                    recipe_name != AUTO
                    or prepared.fidelity.get("top1_agreement", 1.0) >= FIDELITY_BAR
                ):
                    break
            finished = True
            return prepared  # an explicit recipe, the first that builds, a faithful one, or fp32
        finally:
            weights.release()
            stages.close(finished=finished)


def _stages(recipe: Recipe, export_dir: Path, weights: SourceModel) -> int:
    """Bar steps a recipe adds: its quantize and evaluate, plus loading the source (recipes
    built from the weights) or the load and export stages of an export not made yet."""
    if recipe.needs_export:
        return 2 + (0 if is_complete(export_dir) else 2)
    return 2 + (0 if weights.loaded else 1)


def _require_export(source: ModelSource) -> None:
    require(
        "export", f"Preparing {source.name} (export to ONNX and quantize; not in the cache yet)"
    )


def _build_export(source: ModelSource, tmp: Path, stages: Stages) -> None:
    _require_export(source)
    with stages.stage("load"), parsed_once():  # a GGUF file's metadata read once, not 4 times
        tokenizer = load_tokenizer(source)
        hf_folder = materialize_hf_folder(source, tmp / "_hf")
    with stages.stage("export"):
        export_onnx(hf_folder, tmp, tokenizer)
        shutil.rmtree(tmp / "_hf", ignore_errors=True)
    timings = {name: stages.timings[name] for name in ("load", "export")}
    write_manifest(
        tmp,
        {
            "kind": "export",
            "source": source.describe(),
            "versions": library_versions(),
            "timings": timings,
            "created": _now(),
        },
    )


def _recipe_dir(source: ModelSource, recipe_name: str, root: Path) -> Path:
    """Where ``source`` prepared with ``recipe_name`` lives in the cache (complete or not)."""
    params = json.dumps(get_recipe(recipe_name).params, sort_keys=True)
    key = _key(source.content_hash, recipe_name, params, PREPARE_VERSION)
    return root / "models" / f"{source.name}-{recipe_name}-{key}"


def _prepare_recipe(
    source: ModelSource,
    export_dir: Path,
    recipe_name: str,
    root: Path,
    stages: Stages,
    weights: SourceModel,
) -> PreparedModel:
    """Build one recipe's folder (cached). Recipes built from the source's weights need no
    Optimum export and are measured against PyTorch fp32; the others against the export."""
    recipe = get_recipe(recipe_name)
    final = _recipe_dir(source, recipe_name, root)
    key = final.name.rsplit("-", 1)[-1]

    def build(tmp: Path) -> None:
        _require_export(source)
        if recipe.needs_export:
            build_once(export_dir, lambda folder: _build_export(source, folder, stages))
            timings = dict(json.loads((export_dir / "manifest.json").read_text())["timings"])
        else:
            timings = {}
            if not weights.loaded:
                with stages.stage("load"):
                    weights.load(check=recipe.check)  # may refuse it from the config alone
            timings["load"] = stages.timings.get("load", 0.0)
        with stages.stage(f"quantize {recipe_name}"):
            start = time.perf_counter()
            with quiet_export():
                recipe.apply(export_dir / MODEL_FILE, tmp / MODEL_FILE, weights)
            timings["quantize"] = round(time.perf_counter() - start, 3)
            if recipe.needs_export:
                for item in export_dir.iterdir():
                    if item.is_file() and item.suffix != ".onnx" and item.name != "manifest.json":
                        shutil.copy2(item, tmp / item.name)
            else:
                weights.write_files(tmp)
        trim_heap()  # the build's freed pieces (its worker threads' heaps too), before the runs
        with stages.stage(f"evaluate {recipe_name}"):
            start = time.perf_counter()
            if recipe.needs_export:
                fidelity = _fidelity(export_dir, tmp)
            else:
                fidelity = _fidelity_from_source(weights, tmp)
            timings["evaluate"] = round(time.perf_counter() - start, 3)
        write_manifest(
            tmp,
            {
                "kind": "prepared",
                "key": key,
                "name": source.name,
                "source": source.describe(),
                "recipe": {"name": recipe.name, "description": recipe.description, **recipe.params},
                "versions": library_versions(),
                "cpu": cpu_features(),
                "files": {p.name: p.stat().st_size for p in sorted(tmp.iterdir()) if p.is_file()},
                "size_bytes": _model_bytes(tmp),
                "folder_bytes": folder_size(tmp),
                "fidelity": fidelity,
                "timings": timings,
                "created": _now(),
            },
        )

    if recipe.needs_export and not is_complete(final):
        weights.release()  # the export loads the model its own way: not twice in memory
    return PreparedModel.open(build_once(final, build))


def _model_bytes(folder: Path) -> int:
    """The model file and its external weights, if any (``model.onnx.data``)."""
    return sum(p.stat().st_size for p in folder.glob(MODEL_FILE + "*") if p.is_file())


def _fidelity_from_source(weights: SourceModel, candidate_dir: Path) -> dict[str, Any]:
    """A graph built from the source's weights, measured without the Optimum export, against
    the fp32 PyTorch model itself (``SourceModel.reference_logits``: a streamed model runs one
    layer at a time, so no fp32 copy of the whole model is ever in memory)."""
    report = measure_fidelity(
        weights.reference_logits,
        candidate_dir / MODEL_FILE,
        weights.tokenizer,
        reference=REFERENCE,
    )
    return report.as_dict()


def _fidelity(export_dir: Path, candidate_dir: Path) -> dict[str, Any]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(export_dir))
    report = measure_fidelity(export_dir / MODEL_FILE, candidate_dir / MODEL_FILE, tokenizer)
    return report.as_dict()


def tokenizer_folder(
    model: str | os.PathLike[str] | None = None, *, cache_dir: str | os.PathLike[str] | None = None
) -> Path:
    """A cached folder with the source's (repaired) tokenizer alone: seconds instead of a prepare.

    Reading a tokenizer out of a GGUF file takes ~9 s; tests and tools that only need tokens
    (the protocol layer, scripted token sources) load it from here in well under a second.
    """
    source = resolve_source(model)
    if source.kind == "prepared":
        return source.path
    final = cache_root(cache_dir) / "tokenizers" / f"{source.name}-{_key(source.content_hash)}"

    def build(tmp: Path) -> None:
        with parsed_once():
            tokenizer = load_tokenizer(source)
        tokenizer.save_pretrained(str(tmp))
        write_manifest(tmp, {"kind": "tokenizer", "source": source.describe(), "created": _now()})

    return build_once(final, build)
