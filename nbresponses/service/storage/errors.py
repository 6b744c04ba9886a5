"""How the response database reports a disk that lets it down.

A failing write is retried, so the same failure comes back at every batch: it is logged each
time but warned once per kind (full, locked, read-only, ...) and per database, so a notebook
sees one ``StoreWarning`` and goes on generating. A file that cannot be used at all is a
``StoreError``: the caller keeps responses in memory and leaves the file untouched.
"""

from __future__ import annotations

import logging
import warnings

log = logging.getLogger(__name__)


class StoreWarning(UserWarning):
    """The response database could not be read or written; responses stay in memory."""


class StoreError(Exception):
    """The database cannot be used at all (corrupt, from a newer nbresponses, unreadable)."""


def is_read_only(exc: Exception) -> bool:
    """Whether SQLite refused a write because the file (or the connection) is read-only."""
    text = str(exc)
    return "readonly" in text or "read-only" in text


class Warner:
    """Logs every failure; warns once per kind."""

    def __init__(self) -> None:
        self._warned: set[str] = set()

    def __call__(self, kind: str, message: str) -> None:
        log.warning(message)
        if kind not in self._warned:
            self._warned.add(kind)
            warnings.warn(message, StoreWarning, stacklevel=2)
