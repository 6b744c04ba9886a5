"""The on-disk cache of prepared models: where it lives, atomic builds under a lock, listing.

Every entry is built in a temporary folder and renamed into place only when complete (its
``manifest.json`` written last), under a file lock, so two processes preparing the same model
never corrupt it and an interrupted prepare leaves nothing that looks finished.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from filelock import FileLock

CACHE_ENV = "NBRESPONSES_CACHE_DIR"
MANIFEST = "manifest.json"


def cache_root(cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """``cache_dir``, else ``$NBRESPONSES_CACHE_DIR``, else the user's cache dir."""
    if cache_dir is None:
        cache_dir = os.environ.get(CACHE_ENV)
    if cache_dir is None:
        import platformdirs

        cache_dir = platformdirs.user_cache_dir("nbresponses")
    root = Path(cache_dir).expanduser()
    root.mkdir(parents=True, exist_ok=True)
    return root


def is_complete(folder: Path) -> bool:
    return (folder / MANIFEST).is_file()


def build_once(final: Path, build: Callable[[Path], None]) -> Path:
    """Make ``final`` exist by running ``build(tmp)`` at most once across processes.

    ``build`` fills a fresh temporary folder that is renamed to ``final`` when it returns; it
    must write ``manifest.json`` last. On any failure (including KeyboardInterrupt or a full
    disk) the temporary folder is removed and the error propagates.
    """
    root = final.parent.parent
    locks, scratch = root / "locks", root / "tmp"
    locks.mkdir(parents=True, exist_ok=True)
    scratch.mkdir(parents=True, exist_ok=True)
    final.parent.mkdir(parents=True, exist_ok=True)
    if is_complete(final):
        return final
    with FileLock(str(locks / f"{final.parent.name}-{final.name}.lock")):
        if is_complete(final):  # another process finished it while we waited
            return final
        # We hold the lock: leftovers of this entry are from killed builds.
        for stale in scratch.glob(f"{final.name}-*"):
            shutil.rmtree(stale, ignore_errors=True)
        if final.exists():
            shutil.rmtree(final)
        tmp = Path(tempfile.mkdtemp(prefix=f"{final.name}-", dir=scratch))
        try:
            build(tmp)
            tmp.chmod(0o755)  # mkdtemp makes it private; a cache entry is readable like any file
            if not is_complete(tmp):
                raise RuntimeError(f"internal error: build of {final.name} wrote no manifest")
            os.rename(tmp, final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return final


def write_manifest(folder: Path, manifest: dict[str, object]) -> None:
    """Write ``manifest.json`` atomically (it marks the folder complete)."""
    partial = folder / (MANIFEST + ".partial")
    partial.write_text(json.dumps(manifest, indent=2, sort_keys=True, default=str))
    os.replace(partial, folder / MANIFEST)


def folder_size(folder: Path) -> int:
    """Bytes on disk, counting hard-linked files once."""
    seen: set[tuple[int, int]] = set()
    total = 0
    for path in folder.rglob("*"):
        with contextlib.suppress(OSError):
            stat = path.stat()
            if path.is_file() and (stat.st_dev, stat.st_ino) not in seen:
                seen.add((stat.st_dev, stat.st_ino))
                total += stat.st_size
    return total
