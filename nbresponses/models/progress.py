"""Stage progress for long work: one ``tqdm.auto`` bar whose steps are named and timed."""

from __future__ import annotations

import contextlib
import functools
import importlib
import time
from collections.abc import Iterator


class Stages:
    """A progress bar over named stages that also records how long each took (seconds)."""

    def __init__(self, title: str, total: int, *, enabled: bool = True) -> None:
        from tqdm.auto import tqdm

        self.timings: dict[str, float] = {}
        self._bar = tqdm(total=total, desc=title, unit="stage", disable=not enabled, leave=True)

    @contextlib.contextmanager
    def stage(self, name: str) -> Iterator[None]:
        self._bar.set_postfix_str(name)
        start = time.perf_counter()
        try:
            yield
        finally:
            self.timings[name] = round(time.perf_counter() - start, 3)
            self._bar.update(1)

    def extend(self, stages: int) -> None:
        """Announce more stages than planned (e.g. auto trying a more faithful recipe)."""
        self._bar.total += stages
        self._bar.refresh()

    def close(self, *, finished: bool = True) -> None:
        """Close the bar; when ``finished``, fill it (cached stages are skipped, not failed)."""
        if finished:
            self._bar.n = self._bar.total
            self._bar.set_postfix_str("done")
        self._bar.close()


# Bars that libraries draw with a plain tqdm no setting turns off: (module, its tqdm name).
# transformers' GGUF loader shows one per load ("Converting and de-quantizing GGUF tensors").
_PLAIN_TQDM = (("transformers.modeling_gguf_pytorch_utils", "tqdm"),)


@contextlib.contextmanager
def quiet_library_bars() -> Iterator[None]:
    """Turn off the progress bars of transformers (GGUF de-quantization, checkpoint loading) and
    huggingface_hub while preparing: our stage bar is the one bar, and ``progress=False`` shows
    none. Each is restored as it was."""
    from huggingface_hub.utils import (
        are_progress_bars_disabled,
        disable_progress_bars,
        enable_progress_bars,
    )
    from transformers.utils import logging as hf_logging

    transformers_on = hf_logging.is_progress_bar_enabled()
    hub_on = not are_progress_bars_disabled()
    hf_logging.disable_progress_bar()
    disable_progress_bars()
    patched = []
    for module_name, attribute in _PLAIN_TQDM:
        try:
            module = importlib.import_module(module_name)
        except ImportError:  # another version of the library: nothing to silence there
            continue
        original = getattr(module, attribute, None)
        if original is not None:
            setattr(module, attribute, functools.partial(original, disable=True))
            patched.append((module, attribute, original))
    try:
        yield
    finally:
        for module, attribute, original in patched:
            setattr(module, attribute, original)
        if transformers_on:
            hf_logging.enable_progress_bar()
        if hub_on:
            enable_progress_bars()
