"""Stage progress for long work: one ``tqdm.auto`` bar whose steps are named and timed."""

from __future__ import annotations

import contextlib
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


@contextlib.contextmanager
def library_progress_bars(enabled: bool) -> Iterator[None]:
    """Let transformers' own bars (e.g. GGUF de-quantization) show only when ``enabled``."""
    from transformers.utils import logging as hf_logging

    was_enabled = hf_logging.is_progress_bar_enabled()
    if not enabled and was_enabled:
        hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if not enabled and was_enabled:
            hf_logging.enable_progress_bar()
