"""What the database forgets: deleted responses, and by age or size what retention drops.

A row a stored child continues from is hidden, not deleted (the child's conversation is
read through it), and goes with its last such child. Retention runs in the writer thread
(it writes), when the database opens and then at most once a minute of writing; it never
drops a running response, and gives the freed pages back to the disk.
"""

from __future__ import annotations

import contextlib
import sqlite3
import time
from collections.abc import Callable, Sequence
from pathlib import Path

INTERVAL = 60.0  # seconds of writing between two retention passes
_SETTLED = "hidden = 0 AND status NOT IN ('queued', 'in_progress')"


def hide(db: sqlite3.Connection, ids: Sequence[str]) -> None:
    """Delete rows; a row a stored child continues from is hidden instead, and goes
    with the last such child."""
    db.executemany("UPDATE responses SET hidden = 1 WHERE id = ?", [(i,) for i in ids])
    while True:
        gone = db.execute(
            "DELETE FROM responses WHERE hidden = 1 AND NOT EXISTS "
            "(SELECT 1 FROM responses c WHERE c.previous_response_id = responses.id)"
        ).rowcount
        if not gone:
            return


class Retention:
    """Forgets responses older than ``keep_days`` and the oldest past ``max_disk_bytes``."""

    def __init__(
        self,
        path: Path,
        keep_days: float | None,
        max_disk_bytes: int | None,
        warn: Callable[[str, str], None],
    ) -> None:
        self.path = path
        self.keep_days = keep_days
        self.max_disk_bytes = max_disk_bytes
        self._warn = warn
        self._last = 0.0

    def due(self) -> bool:
        return time.time() - self._last > INTERVAL

    def run(self, db: sqlite3.Connection) -> None:
        """One pass on the writer's connection; a failure warns and leaves the rows."""
        self._last = time.time()
        try:
            if self.keep_days is not None:
                cutoff = time.time() - self.keep_days * 86400
                query = f"SELECT id FROM responses WHERE {_SETTLED} AND created_at < ?"
                _forget(db, [r[0] for r in db.execute(query, (cutoff,)).fetchall()])
            if self.max_disk_bytes is not None:
                _forget(db, self._past_size(db, self.max_disk_bytes))
        except sqlite3.Error as exc:
            with contextlib.suppress(sqlite3.Error):
                db.execute("ROLLBACK")
            self._warn("retention", f"{self.path}: old responses could not be removed: {exc}")

    @staticmethod
    def _past_size(db: sqlite3.Connection, limit: int) -> list[str]:
        """The oldest settled responses to drop so the rows fit in ``limit`` bytes."""
        total = db.execute("SELECT COALESCE(SUM(size), 0) FROM responses").fetchone()[0]
        query = f"SELECT id, size FROM responses WHERE {_SETTLED} ORDER BY created_at"
        ids = []
        for response_id, size in db.execute(query).fetchall():
            if total <= limit:
                break
            ids.append(response_id)
            total -= size
        return ids


def _forget(db: sqlite3.Connection, ids: Sequence[str]) -> None:
    """Retention's delete: one transaction, then the freed pages go back to the disk."""
    if not ids:
        return
    db.execute("BEGIN IMMEDIATE")
    try:
        hide(db, ids)
        db.execute("COMMIT")
    except BaseException:
        db.execute("ROLLBACK")
        raise
    db.execute("PRAGMA incremental_vacuum")
