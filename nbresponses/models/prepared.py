"""A prepared model: an ONNX file with KV cache, its tokenizer and a manifest, in one folder."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from nbresponses.models.errors import ModelSourceError
from nbresponses.models.recipes import MODEL_FILE


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
    def size_bytes(self) -> int:
        return int(self.manifest.get("size_bytes", self.onnx_path.stat().st_size))

    @cached_property
    def config(self) -> dict[str, Any]:
        return json.loads((self.path / "config.json").read_text())

    @property
    def context_length(self) -> int:
        return int(self.config.get("max_position_embeddings", 2048))

    def load_tokenizer(self) -> Any:
        """The (repaired) tokenizer saved next to the model, with its chat template."""
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(str(self.path))

    def describe(self) -> str:
        """One line: name, recipe, size, fidelity."""
        fid = self.fidelity
        agreement = fid.get("top1_agreement")
        fidelity = (
            f"top-1 {agreement:.1%}, KL {fid.get('mean_kl', 0):.4f}"
            if agreement is not None
            else "fidelity unknown"
        )
        return f"{self.name} [{self.recipe}] {self.size_bytes / 1e6:.0f} MB, {fidelity}"
