"""nbresponses: the OpenAI Responses API inside the Jupyter kernel.

Names are imported lazily so that ``import nbresponses`` stays fast and a user who only wants
the frames or the widget never pays for ONNX Runtime or transformers: ``pip install nbresponses``
is enough for ``nbr.show`` and the frames. The engine's names need ``nbresponses[engine]``;
without it, using one raises an ImportError that says so.
"""

from __future__ import annotations

import importlib
import warnings
from typing import Any

from nbresponses._extras import require
from nbresponses.traffic.lookup import stored as _stored
from nbresponses.traffic.recording import keep_shown as _keep_shown
from nbresponses.traffic.recording import register_recorder as _register_recorder

__version__ = "0.1.0"

# public name -> module that defines it
_LAZY: dict[str, str] = {
    "Engine": "nbresponses.engine",
    "RemoteEngine": "nbresponses.analysis.remote",
    "prepare_model": "nbresponses.models.prepare",
    "list_models": "nbresponses.models.prepared",
    "PreparedModel": "nbresponses.models.prepared",
    "show": "nbresponses.view",
    "ResponseView": "nbresponses.view",
    "logprobs_frame": "nbresponses.frames",
    "top_logprobs_frame": "nbresponses.frames",
    "usage_frame": "nbresponses.frames",
    "events_frame": "nbresponses.frames",
    "sequence_logprob": "nbresponses.frames",
    "perplexity": "nbresponses.frames",
    "classification_confidence": "nbresponses.frames",
    "plot_logprobs": "nbresponses.frames",
    "samples_frame": "nbresponses.frames",
    "function_tool": "nbresponses.service.function_tools",
    "compare_scorings": "nbresponses.frames",
    "option_likelihoods": "nbresponses.frames",
    "words_frame": "nbresponses.frames",
    "span_surprisal": "nbresponses.frames",
    "multiple_choice_frame": "nbresponses.frames",
    "choice_accuracy": "nbresponses.frames",
    "reliability_table": "nbresponses.frames",
    "calibration_summary": "nbresponses.frames",
    "divergence_summary": "nbresponses.frames",
    "plot_surprisal": "nbresponses.frames",
    "plot_reliability": "nbresponses.frames",
    "plot_divergence": "nbresponses.frames",
    "plot_options": "nbresponses.frames",
    "plot_lens": "nbresponses.frames",
    "lens_frame": "nbresponses.frames",
    "history": "nbresponses.service.history",
    "record": "nbresponses.service.keep",
    "StoreWarning": "nbresponses.service.database",
}

# old names, kept for one release (not in __all__): calling one warns with its new name
_DEPRECATED: dict[str, str] = {
    "compare": "nbresponses.frames",  # now compare_scorings
    "logprobs_heatmap": "nbresponses.frames",  # now plot_logprobs
}

# names that need the engine extra (the rest work in the light install)
_ENGINE_NAMES = frozenset(
    {
        "Engine",
        "RemoteEngine",
        "record",
        "prepare_model",
        "list_models",
        "PreparedModel",
        "function_tool",
    }
)

# subpackages a user reaches as attributes (``nbr.frames.lens_frame``) in a fresh kernel
_SUBPACKAGES = frozenset({"frames", "view"})

__all__ = ["__version__", *_LAZY, "frames"]


def __getattr__(name: str) -> Any:
    if name in _SUBPACKAGES:
        return importlib.import_module(f"nbresponses.{name}")
    module = _LAZY.get(name) or _DEPRECATED.get(name)
    if module is None:
        raise AttributeError(f"module 'nbresponses' has no attribute {name!r}")
    if name in _ENGINE_NAMES:
        require("engine", f"nbr.{name}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def _record_shown(response: Any, base_url: str | None, input: Any = None) -> None:
    """``show(stream, record=True)``'s first finished response, on any import path: load the
    store's recorder (``service/keep.py`` registers it), then hand the response to it. Here,
    as the package is imported, for the reason ``_DefaultStoreFile`` is; the store is imported
    at first use, so ``import nbresponses`` stays light."""
    try:
        importlib.import_module("nbresponses.service.keep")  # registers the store's recorder
    except ImportError:  # a light install has no store to keep them in
        warnings.warn(
            "record=True keeps responses in the history, which needs nbresponses[engine]",
            UserWarning,
            stacklevel=3,
        )
        return
    _keep_shown(response, base_url, input)


_register_recorder(_record_shown, fallback=True)


class _DefaultStoreFile:
    """The default store file, the frames' last resort for an id no open store holds (a new
    kernel reads yesterday's responses without an engine). Registered here, as the package is
    imported, because every import path runs this module first: ``nbr.logprobs_frame`` and
    ``nbresponses.frames.logprobs_frame`` find the same responses. Its reader is imported at
    the first lookup, so ``import nbresponses`` stays light."""

    def find(self, response_id: str) -> Any:
        return self._file().find(response_id)

    def __repr__(self) -> str:
        return repr(self._file())

    @staticmethod
    def _file() -> Any:
        from nbresponses.service.history import StoreFile

        return StoreFile()


_DEFAULT_STORE_FILE = _DefaultStoreFile()  # the registry holds it weakly
_stored.register(_DEFAULT_STORE_FILE, fallback=True)


def __dir__() -> list[str]:
    return sorted(__all__)
