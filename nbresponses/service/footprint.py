"""How much memory an object graph of pydantic models, containers and scalars takes.

The store's byte bound is meant as a memory bound, and Python objects take several times their
JSON length (a 25-turn chain measured 5.5x with tracemalloc), so JSON length would let a
"64 MB" store hold a few hundred MB. This walk sums ``sys.getsizeof`` over every object reached
once, which tracemalloc confirms within a few percent. pympler's ``asizeof`` does the same in
general; this walk knows the only shapes the store holds (pydantic models, dicts, lists,
tuples, sets, scalars), so it is a few lines and several times faster.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from typing import Any

from pydantic import BaseModel

_ATOMS = (str, bytes, int, float, bool, type(None))


def footprint(objects: Iterable[Any], seen: set[int] | None = None) -> int:
    """Bytes of ``objects`` and everything they reach, skipping ids in (and adding to) ``seen``.

    Pass the same ``seen`` to count several graphs that share objects once.
    """
    seen = set() if seen is None else seen
    stack = list(objects)
    total = 0
    while stack:
        obj = stack.pop()
        if id(obj) in seen or obj is None or isinstance(obj, bool):
            continue  # singletons cost nothing per use
        seen.add(id(obj))
        total += sys.getsizeof(obj)
        if isinstance(obj, _ATOMS):
            continue
        if isinstance(obj, BaseModel):
            state = obj.__dict__
            total += sys.getsizeof(state)
            stack.extend(state.values())
            if obj.__pydantic_extra__:
                stack.append(obj.__pydantic_extra__)
            stack.append(obj.__pydantic_fields_set__)
        elif isinstance(obj, dict):
            stack.extend(obj.keys())
            stack.extend(obj.values())
        elif isinstance(obj, list | tuple | set | frozenset):
            stack.extend(obj)
    return total
