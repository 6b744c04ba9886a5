"""Reads of the response database, from any thread (the event loop, ``nbr.history()``).

One connection behind a lock: WAL lets it read while the writer thread (or another process)
writes, so a read never waits for a commit. A file that cannot be read warns and reads as
empty: the memory store still answers.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from nbresponses.service.storage.schema import Row

# A response and its ancestors, root first (``previous_response_id`` up to the first missing).
_CHAIN = """
WITH RECURSIVE chain(n, previous, depth) AS (
    SELECT n, previous_response_id, 0 FROM responses WHERE id = ?
    UNION ALL
    SELECT r.n, r.previous_response_id, chain.depth + 1
    FROM responses r JOIN chain ON r.id = chain.previous
)
SELECT responses.* FROM chain JOIN responses USING (n) ORDER BY chain.depth DESC
"""


class Reader:
    """The read connection; ``db`` is also the one that sets up the schema when opening."""

    def __init__(
        self, db: sqlite3.Connection, path: Path, warn: Callable[[str, str], None]
    ) -> None:
        self.db = db
        self.path = path
        self._warn = warn
        self._lock = threading.Lock()

    def rows(self, response_id: str, *, chain: bool = False) -> list[Row]:
        """The response's row (hidden ones are not found), with ``chain`` its ancestors
        first: ``[root, ..., response]``. An ancestor missing leaves the list short."""
        rows = self._fetch(
            _CHAIN if chain else "SELECT * FROM responses WHERE id = ?", (response_id,)
        )
        return [] if not rows or rows[-1]["hidden"] else rows

    def running(self) -> list[Row]:
        """The id and owner of every row still running (in any process)."""
        query = "SELECT id, owner FROM responses WHERE status IN ('queued', 'in_progress')"
        return self._fetch(query, ())

    def _fetch(self, sql: str, params: Sequence[Any]) -> list[Row]:
        """The rows as dicts; none, with a warning, when the file cannot be read."""
        try:
            with self._lock:
                return [dict(r) for r in self.db.execute(sql, params)]
        except sqlite3.DatabaseError as exc:
            self._warn("read", f"{self.path} could not be read: {exc}")
            return []

    def query(self, sql: str, params: Sequence[Any] = ()) -> list[sqlite3.Row]:
        with self._lock:
            return self.db.execute(sql, params).fetchall()

    def count(self) -> int:
        return int(self.query("SELECT COUNT(*) FROM responses WHERE hidden = 0")[0][0])

    def close(self) -> None:
        self.db.close()
