"""How much memory an object graph of pydantic models, containers and scalars takes.

The store's byte bound is meant as a memory bound, and Python objects take several times their
JSON length (a 25-turn chain measured 5.5x with tracemalloc), so JSON length would let a
"64 MB" store hold a few hundred MB. This walk sums ``sys.getsizeof`` over every object reached
once, which tracemalloc confirms within a few percent. pympler's ``asizeof`` does the same in
general; this walk knows the only shapes the store holds (pydantic models, dicts, lists,
tuples, sets, scalars), so it is a few lines and several times faster.
"""

from __future__ import annotations

import ctypes
import functools
import os
import sys
from collections.abc import Iterable
from typing import Any

from pydantic import BaseModel

_ATOMS = (str, bytes, int, float, bool, type(None))


def footprint(objects: Iterable[Any], seen: set[int] | None = None) -> int:
    """Bytes of ``objects`` and everything they reach, skipping ids in (and adding to) ``seen``.

    Pass the same ``seen`` to count several graphs that share objects once. Numbers and a
    model's set of given field names are counted without the identity check (they are
    scalars, or hold only field names): a 1,000-token response with 20 alternatives each is
    about 200,000 objects, and the walk runs on the event loop.
    """
    seen = set() if seen is None else seen
    stack = list(objects)
    total = 0
    getsizeof = sys.getsizeof
    while stack:
        obj = stack.pop()
        if id(obj) in seen or obj is None or obj is True or obj is False:
            continue  # singletons cost nothing per use
        seen.add(id(obj))
        total += getsizeof(obj)
        if isinstance(obj, BaseModel):
            state = obj.__dict__
            total += getsizeof(state) + getsizeof(obj.__pydantic_fields_set__)
            total += _push(state.values(), stack)
            if obj.__pydantic_extra__:
                stack.append(obj.__pydantic_extra__)
        elif isinstance(obj, _ATOMS):
            continue
        elif isinstance(obj, dict):
            stack.extend(obj.keys())
            total += _push(obj.values(), stack)
        elif isinstance(obj, list | tuple | set | frozenset):
            total += _push(obj, stack)
    return total


def _push(values: Iterable[Any], stack: list[Any]) -> int:
    """Queue what may be shared; return the size of the numbers, counted on the spot (small
    ints are the interpreter's own: a token's byte values cost nothing)."""
    size = 0
    for value in values:
        kind = type(value)
        if kind is float:
            size += 24
        elif kind is int:
            if not -5 <= value <= 256:
                size += sys.getsizeof(value)
        elif value is not None and kind is not bool:
            stack.append(value)
    return size


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
            "fordblks", "keepcost",
        )
    ]  # fmt: skip


@functools.cache
def _libc() -> Any:
    """glibc, when this process runs on it (``mallinfo2``: glibc 2.33 on); else None."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallinfo2.restype = _MallInfo2
    except (OSError, AttributeError):
        return None
    return libc


def mapped_files() -> dict[str, int] | None:
    """Resident bytes of the file-backed mappings of this process (Linux; None elsewhere):
    ``libraries_bytes`` (shared objects' code) and ``files_bytes`` (every other mapped file:
    above all the model's weights, which ONNX Runtime maps from ``model.onnx.data``). Why
    report them: their pages become resident as they are first read and stay until the kernel
    needs the memory, so a server's RSS rises for thousands of requests with nothing leaking:
    measured, the weights file's mapping went from 61 to 64 MB resident between requests 4,000
    and 5,000 (of its 108 MB), all the growth of RSS beyond the caches then. Bounded by the
    files' sizes, clean and reclaimable: not memory a request holds."""
    try:
        smaps = open("/proc/self/smaps")  # noqa: SIM115 (read line by line below)
    except OSError:
        return None
    files = libraries = 0
    path = ""
    with smaps:
        for line in smaps:
            if line[0] in "0123456789abcdef" and "-" in line.split(" ", 1)[0]:
                fields = line.split()
                path = fields[5] if len(fields) > 5 else ""
            elif line.startswith("Rss:") and path.startswith("/"):
                size = int(line.split()[1]) * 1024
                if ".so" in path.rsplit("/", 1)[-1]:
                    libraries += size
                else:
                    files += size
    return {"files_bytes": files, "libraries_bytes": libraries}


M_MMAP_THRESHOLD = -3  # mallopt's parameter (malloc.h)
SERVE_MMAP_THRESHOLD = 16 * 2**10  # bytes: buffers from here up are mmapped, given back freed
_threshold: list[int] = []  # the threshold this process set, if it set one


def bound_free_heap(threshold: int = SERVE_MMAP_THRESHOLD) -> bool:
    """Give every buffer of ``threshold`` bytes or more its own mapping, returned to the system
    when freed (glibc's ``M_MMAP_THRESHOLD``; False elsewhere, or when the user set
    ``MALLOC_MMAP_THRESHOLD_``, which wins). Why: a long-running server churns the prefix
    cache's entries (60 arrays of ~30 KB, sizes varying with the prompt) below glibc's dynamic
    threshold, so the heap kept growing with freed chunks no later request fit: +31 MB of RSS
    beyond the reported caches from request 1,000 to 3,750 (benchmarks/serve_memory.py). With
    the fixed threshold the heap's free part stays a few MB. ``nbresponses serve`` calls it at
    start; a kernel does not (a notebook's process is the user's)."""
    libc = _libc()
    if libc is None or "MALLOC_MMAP_THRESHOLD_" in os.environ:
        return False
    if not libc.mallopt(M_MMAP_THRESHOLD, int(threshold)):
        return False
    _threshold[:] = [int(threshold)]
    return True


def allocator_stats() -> dict[str, int] | None:
    """What the C allocator holds (glibc; None elsewhere): ``in_use_bytes`` (Python objects,
    arrays, ONNX Runtime's buffers, caches included), ``free_bytes`` (freed chunks it keeps for
    reuse: what churn of variably sized buffers leaves behind, counted in RSS where touched)
    and ``mmapped_bytes``. The server reports it on ``/health`` beside its caches: growth of
    the process that no cache explains shows here first."""
    libc = _libc()
    if libc is None:
        return None
    info = libc.mallinfo2()
    return {
        "in_use_bytes": int(info.uordblks),
        "free_bytes": int(info.fordblks),
        "mmapped_bytes": int(info.hblkhd),
        # buffers from this size up are mmapped (``bound_free_heap``); 0: glibc's dynamic rule
        "mmap_threshold_bytes": _threshold[0] if _threshold else 0,
    }
