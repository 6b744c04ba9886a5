"""The registry of places stored responses are found by id: order, fallbacks, weak holding,
and a KeyError that names the id and every place asked."""

from __future__ import annotations

import gc

import pytest

from nbresponses.traffic.lookup import StoredResponses


class Held:
    """A lookup over a dict of id -> response."""

    def __init__(self, name: str, **responses: object) -> None:
        self.name = name
        self.responses = responses

    def find(self, response_id: str) -> object:
        return self.responses.get(response_id)

    def __repr__(self) -> str:
        return f"<{self.name}>"


def test_lookups_are_asked_in_order_and_fallbacks_last() -> None:
    registry = StoredResponses()
    last = Held("file", resp_a="from the file", resp_b="only in the file")
    first = Held("first", resp_a="first")
    second = Held("second", resp_a="second", resp_c="second")
    registry.register(last, fallback=True)
    registry.register(first)
    registry.register(second)
    assert registry.lookups() == [first, second, last]
    assert registry.find("resp_a") == "first"
    assert registry.find("resp_c") == "second"
    assert registry.find("resp_b") == "only in the file"
    registry.unregister(first)
    assert registry.find("resp_a") == "second"
    registry.register(second)  # once only, however often it registers
    assert registry.lookups() == [second, last]


def test_an_id_found_nowhere_names_the_id_and_every_place_asked() -> None:
    registry = StoredResponses()
    with pytest.raises(KeyError, match=r"resp_gone.*nothing: no store is open"):
        registry.find("resp_gone")
    a, b = Held("store a"), Held("the default file")
    registry.register(a)
    registry.register(b, fallback=True)
    with pytest.raises(KeyError, match=r"resp_gone.*<store a>, <the default file>.*lookup="):
        registry.find("resp_gone")


def test_the_registry_keeps_no_lookup_alive() -> None:
    registry = StoredResponses()
    kept = Held("kept", resp_a="a")
    registry.register(kept)
    registry.register(Held("dropped", resp_b="b"))
    gc.collect()
    assert registry.lookups() == [kept]
    with pytest.raises(KeyError, match="resp_b"):
        registry.find("resp_b")


def test_only_an_object_that_finds_can_register() -> None:
    with pytest.raises(TypeError, match="find"):
        StoredResponses().register({"resp_a": "a"})  # type: ignore[arg-type]
