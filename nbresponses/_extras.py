"""The optional extras and a clear ImportError when a feature needs one that is not installed.

``pip install nbresponses`` is the view, the frames and the OpenAI types. Running a prepared
model needs ``nbresponses[engine]``; exporting and quantizing one (the first ``Engine.load`` of
a model, ``nbresponses prepare``) needs ``nbresponses[export]``. Imports nothing of the package.
"""

from __future__ import annotations

import importlib.util

_ENGINE = (
    "onnxruntime",
    "transformers",
    "tokenizers",
    "jinja2",
    "openai_harmony",
    "tqdm",
    "filelock",
    "platformdirs",
    "starlette",
    "uvicorn",
)
# extra -> the top-level modules the code imports from what it installs (export includes engine)
EXTRAS: dict[str, tuple[str, ...]] = {
    "engine": _ENGINE,
    "export": (*_ENGINE, "torch", "optimum", "onnx", "onnx_ir", "accelerate", "gguf"),
}


class MissingExtra(ImportError):
    """A feature needs an optional extra of nbresponses that is not installed."""

    def __init__(self, extra: str, feature: str, modules: list[str]) -> None:
        self.extra = extra
        super().__init__(
            f"{feature} needs the {extra!r} extra of nbresponses: "
            f"pip install 'nbresponses[{extra}]' (not installed: {', '.join(modules)})",
            name=modules[0] if modules else None,
        )


def missing(extra: str) -> list[str]:
    """The modules of ``extra`` that cannot be imported here."""
    return [name for name in EXTRAS[extra] if importlib.util.find_spec(name) is None]


def require(extra: str, feature: str) -> None:
    """Raise :class:`MissingExtra` naming ``extra`` when any of its modules is missing."""
    absent = missing(extra)
    if absent:
        raise MissingExtra(extra, feature, absent)
