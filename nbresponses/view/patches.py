"""Coalesce state changes into patches for the front end.

Every event changes the Python state at once, but the front end is only told at a steady,
low rate: consecutive text deltas to the same field merge into one ``append``, so a flush
costs the same whether 1 or 1,000 tokens arrived since the last one.
"""

from __future__ import annotations

from typing import Any

Path = list[str | int]


class PatchBuffer:
    """Pending operations, in order; ``take()`` hands them over and starts afresh.

    Operations are JSON lists that the front end applies in order to its copy of the state:
    ``["set", path, value]``, ``["append", path, text]`` (string concatenation) and
    ``["extend", path, values]`` (list concatenation).
    """

    __slots__ = ("_open", "_ops")

    def __init__(self) -> None:
        self._ops: list[list[Any]] = []
        # path -> the append/extend op still open for merging; a "set" closes them all so that
        # operations on overlapping paths keep their order.
        self._open: dict[tuple[str | int, ...], list[Any]] = {}

    def __len__(self) -> int:
        return len(self._ops)

    def set(self, path: Path, value: Any) -> None:
        """Replace the value at ``path``; ``value`` must not be mutated afterwards."""
        self._ops.append(["set", path, value])
        self._open.clear()

    def append(self, path: Path, text: str) -> None:
        """Append ``text`` to the string at ``path``."""
        key = tuple(path)
        op = self._open.get(key)
        if op is not None and op[0] == "append":
            op[2].append(text)
            return
        op = ["append", path, [text]]
        self._ops.append(op)
        self._open[key] = op

    def extend(self, path: Path, values: list[Any]) -> None:
        """Append ``values`` to the list at ``path``."""
        key = tuple(path)
        op = self._open.get(key)
        if op is not None and op[0] == "extend":
            op[2].extend(values)
            return
        op = ["extend", path, list(values)]
        self._ops.append(op)
        self._open[key] = op

    def take(self) -> list[list[Any]]:
        """The pending operations, merged, ready to send; the buffer is empty afterwards."""
        ops = self._ops
        for op in ops:
            if op[0] == "append":
                op[2] = "".join(op[2])
        self._ops = []
        self._open = {}
        return ops


def apply_ops(state: Any, ops: list[list[Any]]) -> None:
    """Apply operations to a state (the front end does the same; used to check patches)."""
    for kind, path, value in ops:
        target = state
        for key in path[:-1]:
            target = target[key]
        last = path[-1]
        if kind == "set":
            if isinstance(target, list) and last == len(target):
                target.append(value)
            else:
                target[last] = value
        elif kind == "append":
            target[last] = (target[last] or "") + value
        elif kind == "extend":
            if target[last] is None:
                target[last] = []
            target[last].extend(value)
        else:
            raise ValueError(f"unknown patch operation {kind!r}")
