"""Crash recovery: a response still running when its process died reads back as failed.

A row written as running carries its process's ``owner`` id, and the process holds an
advisory lock on the owner's file (beside the database) while it lives; the OS frees the lock
on any exit, kill -9 included. So a running row whose owner's lock is free was cut off: it is
marked failed with the reason, never left ``in_progress``. Without ``fcntl`` (Windows) owners
are judged by their pid, and a live response is never failed.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sqlite3
import time
import uuid
from collections.abc import Iterable
from pathlib import Path

from openai.types.responses import Response
from openai.types.responses.response_error import ResponseError

from nbresponses.service.storage.schema import RUNNING, Row

log = logging.getLogger(__name__)


class Owners:
    """This process's owner id and lock, and whether another row's owner still lives."""

    def __init__(self, path: Path) -> None:
        self.owner = f"{os.getpid()}-{uuid.uuid4().hex[:12]}"
        self._folder = path.with_name(f"{path.name}-owners")
        self._fd: int | None = None

    def hold(self) -> None:
        """Lock this process's owner file for its lifetime (the OS frees it on any exit)."""
        try:
            import fcntl
        except ImportError:  # Windows: owners are judged by pid (see alive)
            return
        path = self._folder / self.owner
        try:
            path.parent.mkdir(exist_ok=True)
            fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o644)
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            self._fd = fd
        except OSError as exc:
            log.debug("no owner lock for %s: %s", path, exc)

    def release(self) -> None:
        """A clean end: the owner file goes (its rows are written as ended by now)."""
        if self._fd is not None:
            with contextlib.suppress(OSError):
                (self._folder / self.owner).unlink()
                os.close(self._fd)
            self._fd = None

    def alive(self, owner: str) -> bool:
        if owner == self.owner:
            return True
        try:
            import fcntl
        except ImportError:
            return _pid_alive(owner)
        path = self._folder / owner
        try:
            fd = os.open(path, os.O_RDWR)
        except FileNotFoundError:
            return False  # its process closed cleanly (or never locked): it is gone
        except OSError:
            return _pid_alive(owner)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        except OSError:
            return _pid_alive(owner)
        finally:
            os.close(fd)
        with contextlib.suppress(OSError):
            path.unlink()
        return False

    def dead(self, rows: Iterable[Row]) -> list[str]:
        """The ids of running rows (``id``, ``owner``) whose process is gone."""
        rows = list(rows)
        alive = {owner: self.alive(owner) for owner in {row["owner"] or "" for row in rows}}
        return [row["id"] for row in rows if not alive[row["owner"] or ""]]

    def failed_row(self, db: sqlite3.Connection, response_id: str) -> Row | None:
        """The row of a response cut off by its process's end, as failed (runs in the
        writer, on its connection: the row as it is now, not as it was when queued)."""
        row = db.execute("SELECT * FROM responses WHERE id = ?", (response_id,)).fetchone()
        if row is None or row["status"] not in RUNNING or self.alive(row["owner"] or ""):
            return None
        return cut_off(dict(row))


def cut_off(row: Row) -> Row:
    """A running row whose process ended: failed, with the reason; output as last written."""
    response = Response.model_validate_json(row["response"])
    pid = (row["owner"] or "?").split("-")[0]
    message = (
        f"The process generating this response (pid {pid}) ended before it finished; "
        "what it generated after it was stored is lost."
    )
    response.status = "failed"
    response.error = ResponseError(code="server_error", message=message)
    return {
        **row,
        "status": "failed",
        "error": message,
        "owner": None,
        "updated_at": time.time(),
        "response": response.model_dump_json(exclude_unset=True, by_alias=True),
    }


def _pid_alive(owner: str) -> bool:
    """Whether the owner's process may live (without owner locks: Windows, odd file systems)."""
    if os.name == "nt":
        return True  # os.kill would terminate it there; a live response is never failed
    try:
        pid = int(owner.split("-")[0])
        os.kill(pid, 0)
    except (ValueError, ProcessLookupError):
        return False
    except PermissionError:
        return True
    return True
