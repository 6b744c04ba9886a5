"""Read a GGUF file's metadata once per prepare, not once per transformers call.

transformers 4.57 parses the whole GGUF file (``gguf.GGUFReader``: 294k metadata values for
SmolLM2's vocabulary and merges, ~3 s) and converts every value (~2.4 s) for each of the
config, the tokenizer and the weights: four times when a prepare loads the tokenizer and the
model. Loading the weights also builds ``gguf``'s tensor-name map once per PyTorch module
(397 times, ~10 s). Inside ``parsed_once()`` each of these is computed once per file and
reused (as the quiet bars of ``progress.py``, by swapping the library's module attributes,
restored on exit): measured on the bundled model, ~20 s of a ~35 s source load.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import importlib
from collections.abc import Callable, Iterator
from typing import Any

# Modules that bind transformers' GGUF reader by name at import time.
_CHECKPOINT_USERS = (
    "transformers.modeling_gguf_pytorch_utils",
    "transformers.configuration_utils",
    "transformers.tokenization_utils_fast",
    "transformers.models.auto.tokenization_auto",
)


def _metadata_once(load: Callable[..., Any]) -> Callable[..., Any]:
    """``load_gguf_checkpoint`` whose metadata-only calls (config, tokenizer) are computed
    once per path; callers get a deep copy (they edit what they get)."""
    cache: dict[str, Any] = {}

    @functools.wraps(load)
    def wrapper(path: Any, return_tensors: bool = False, model_to_load: Any = None) -> Any:
        if return_tensors or model_to_load is not None:
            return load(path, return_tensors=return_tensors, model_to_load=model_to_load)
        key = str(path)
        if key not in cache:
            cache[key] = load(path, return_tensors=False)
        return copy.deepcopy(cache[key])

    return wrapper


@contextlib.contextmanager
def parsed_once() -> Iterator[None]:
    """Within the block, GGUF files are parsed once and tensor-name maps built once."""
    try:
        import gguf
    except ImportError:  # no GGUF support installed: nothing to share
        yield
        return
    patched: list[tuple[Any, str, Any]] = []

    def patch(module: Any, name: str, value: Any) -> None:
        patched.append((module, name, getattr(module, name)))
        setattr(module, name, value)

    # transformers imports these from ``gguf`` inside its functions: the swap reaches them.
    patch(gguf, "GGUFReader", functools.lru_cache(maxsize=4)(gguf.GGUFReader))
    patch(gguf, "get_tensor_name_map", functools.lru_cache(maxsize=16)(gguf.get_tensor_name_map))
    shared: Any = None
    for module_name in _CHECKPOINT_USERS:
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            continue
        original = getattr(module, "load_gguf_checkpoint", None)
        if original is None:
            continue
        if shared is None:
            shared = _metadata_once(original)
        patch(module, "load_gguf_checkpoint", shared)
    try:
        yield
    finally:
        for module, name, original in reversed(patched):
            setattr(module, name, original)
