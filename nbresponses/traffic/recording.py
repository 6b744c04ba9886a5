"""Where the view hands a finished remote Response it was asked to keep (``nbr.show(stream,
record=True)``): a hook, so the view stays free of the store. ``nbresponses.service.keep``
registers the SQLite history here when the package's ``show`` is first used.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

# (response, base_url or None, input or None) -> anything; called once per finished response
Recorder = Callable[[Any, "str | None", Any], object]
_RECORDERS: list[Recorder] = []
_FALLBACK: list[Recorder] = []  # asked only while no recorder is registered


def register_recorder(recorder: Recorder, *, fallback: bool = False) -> None:
    """``fallback``: the package's lazy recorder (``nbresponses/__init__.py``), which loads the
    store's own on first use, whatever module ``show`` was imported from."""
    chosen = _FALLBACK if fallback else _RECORDERS
    if recorder not in chosen:
        chosen.append(recorder)


def keep_shown(response: Any, base_url: str | None, input: Any = None) -> None:
    """Hand ``response`` (and the ``input`` it answered, when the caller gave it) to the
    recorders; a failure warns and never breaks the view."""
    if not _RECORDERS and _FALLBACK:
        _FALLBACK[0](response, base_url, input)
        return
    if not _RECORDERS:
        warnings.warn(
            "record=True keeps responses in the history, which needs nbresponses[engine] "
            "(import nbresponses.service.keep)",
            UserWarning,
            stacklevel=2,
        )
        return
    for recorder in _RECORDERS:
        try:
            recorder(response, base_url, input)
        except Exception as exc:  # the view goes on; the user is told
            warnings.warn(f"the response was not recorded: {exc}", UserWarning, stacklevel=2)


def origin_of(source: Any) -> str | None:
    """The URL an openai SDK stream was read from (``stream.response.request.url``)."""
    http = getattr(source, "response", None)
    request = getattr(http, "request", None)
    url = getattr(request, "url", None)
    return str(url) if url is not None else None
