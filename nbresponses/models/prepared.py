"""A prepared model: an ONNX file with KV cache, its tokenizer and a manifest, in one folder."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from nbresponses.models.cache import cache_root, is_complete
from nbresponses.models.errors import ModelSourceError
from nbresponses.models.recipes import MODEL_FILE
from nbresponses.models.tokenizer import StoredTokenizer


@dataclass(frozen=True)
class PreparedModel:
    """What the engine loads. ``manifest`` holds source, recipe, versions, fidelity, timings."""

    path: Path
    manifest: dict[str, Any] = field(compare=False, repr=False)

    @classmethod
    def open(cls, folder: str | Path) -> PreparedModel:
        folder = Path(folder)
        try:
            manifest = json.loads((folder / "manifest.json").read_text())
        except (OSError, ValueError) as exc:
            raise ModelSourceError(f"{folder} is not a prepared model folder: {exc}") from exc
        if not (folder / MODEL_FILE).is_file():
            raise ModelSourceError(f"{folder} has a manifest but no {MODEL_FILE}")
        return cls(folder, manifest)

    @property
    def onnx_path(self) -> Path:
        return self.path / MODEL_FILE

    @property
    def name(self) -> str:
        return str(self.manifest.get("name", self.path.name))

    @property
    def recipe(self) -> str:
        return str(self.manifest.get("recipe", {}).get("name", "?"))

    @property
    def fidelity(self) -> dict[str, Any]:
        return dict(self.manifest.get("fidelity") or {})

    @property
    def prefix_reuse(self) -> bool:
        """False for graphs whose numbers for a token depend on the other tokens of its run
        (dynamic int8: one activation scale per tensor); the engine then reuses no KV."""
        recipe = self.manifest.get("recipe", {})
        return bool(recipe.get("prefix_reuse", recipe.get("name") != "dynamic-int8"))

    @property
    def size_bytes(self) -> int:
        return int(self.manifest.get("size_bytes", self.onnx_path.stat().st_size))

    @cached_property
    def config(self) -> dict[str, Any]:
        return json.loads((self.path / "config.json").read_text())

    @property
    def context_length(self) -> int:
        return int(self.config.get("max_position_embeddings", 2048))

    def load_tokenizer(self) -> Any:
        """The (repaired) tokenizer saved next to the model, with its chat template: read with
        ``tokenizers`` alone when it has a ``tokenizer.json`` (no transformers import, ~3 s
        less per load; see ``tokenizer.py``), else with transformers."""
        stored = StoredTokenizer.load(self.path)
        if stored is not None:
            return stored
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(str(self.path))

    def fidelity_summary(self) -> str:
        """Top-1 agreement with its 95% interval, the mean and p99 absolute Δ logprob, the KL
        and the number of tokens scored, in one line."""
        fid = self.fidelity
        if fid.get("top1_agreement") is None:
            return "fidelity unknown"
        text = f"top-1 {fid['top1_agreement']:.1%}"
        if fid.get("top1_ci95"):
            low, high = fid["top1_ci95"]
            text += f" (95% CI {low:.1%}-{high:.1%})"
        text += f", |Δ logprob| mean {fid.get('mean_abs_dlogprob', float('nan')):.4f}"
        if fid.get("p99_abs_dlogprob") is not None:
            text += f" p99 {fid['p99_abs_dlogprob']:.3f}"
        return text + f", KL {fid.get('mean_kl', float('nan')):.4f} over {fid.get('tokens')} tokens"

    def describe(self) -> str:
        """One line: name, recipe, size, fidelity."""
        return (
            f"{self.name} [{self.recipe}] {self.size_bytes / 1e6:.0f} MB, {self.fidelity_summary()}"
        )


def list_models(cache_dir: str | os.PathLike[str] | None = None) -> list[PreparedModel]:
    """Every prepared model in the cache, newest first."""
    models_dir = cache_root(cache_dir) / "models"
    found = [PreparedModel.open(p) for p in models_dir.glob("*") if is_complete(p)]
    return sorted(found, key=lambda m: m.manifest.get("created", ""), reverse=True)
