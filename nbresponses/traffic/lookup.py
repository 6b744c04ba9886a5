"""Where stored responses are found by id: a ``ResponseLookup`` is anything that answers
``find(response_id)`` with the Response or None, and ``stored`` is this process's registry of
them, which frames read ids through when they are given no lookup of their own.

Whatever holds responses registers itself here (a response store when it is made); frames
never import it. The registry holds its lookups weakly: a store that is garbage collected
leaves it without being told. Lookups are asked in the order they registered, fallbacks (the
default store file, registered by the package) after all others.
"""

from __future__ import annotations

import weakref
from typing import Any, Protocol, runtime_checkable

__all__ = ["ResponseLookup", "StoredResponses", "find_in", "stored"]


@runtime_checkable
class ResponseLookup(Protocol):
    """Finds stored responses by id; None means "not here" (another lookup may have it)."""

    def find(self, response_id: str) -> Any: ...


class StoredResponses:
    """The lookups of one process, each asked in turn; ``find`` raises a KeyError that names
    the id and every place it looked."""

    def __init__(self) -> None:
        self._lookups: list[weakref.ref[ResponseLookup]] = []
        self._fallbacks: list[weakref.ref[ResponseLookup]] = []

    def register(self, lookup: ResponseLookup, *, fallback: bool = False) -> None:
        """Ask ``lookup`` too (``fallback``: after every other lookup); held weakly."""
        if not isinstance(lookup, ResponseLookup):
            raise TypeError(f"a lookup has a find(response_id) method; {lookup!r} has none")
        self.unregister(lookup)
        (self._fallbacks if fallback else self._lookups).append(weakref.ref(lookup))

    def unregister(self, lookup: ResponseLookup) -> None:
        """Ask ``lookup`` no more (the lookups already collected go too)."""
        for refs in (self._lookups, self._fallbacks):
            refs[:] = [ref for ref in refs if ref() not in (None, lookup)]

    def lookups(self) -> list[ResponseLookup]:
        """The live lookups, in the order ``find`` asks them."""
        live = (ref() for ref in (*self._lookups, *self._fallbacks))
        return [lookup for lookup in live if lookup is not None]

    def find(self, response_id: str) -> Any:
        return find_in(self.lookups(), response_id)


def find_in(lookups: list[ResponseLookup], response_id: str) -> Any:
    """The first of ``lookups`` to hold ``response_id``; a KeyError naming them all if none does."""
    for lookup in lookups:
        found = lookup.find(response_id)
        if found is not None:
            return found
    where = ", ".join(map(repr, lookups)) or "nothing: no store is open in this process"
    raise KeyError(
        f"No stored response with id '{response_id}' (looked in {where}). Pass lookup= "
        "(an engine, a client's store) to read it from elsewhere."
    )


stored = StoredResponses()
