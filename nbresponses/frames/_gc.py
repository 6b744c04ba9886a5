"""Pause the cyclic garbage collector while building columns.

Building a frame allocates millions of short-lived tuples and lists; each allocation burst
triggers collections that walk every live object, including the Response being read (millions
of pydantic objects), which made a 1M-token frame several times slower. The new objects hold
no cycles, so pausing collection is safe.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["gc_paused"]


@contextmanager
def gc_paused() -> Iterator[None]:
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
