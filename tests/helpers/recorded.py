"""Load the recorded OpenAI Responses traffic in ``tests/fixtures/recorded`` as plain dicts.

Consumers (frames, view, protocol tests) want the same thing from these files: the events of
each stream and each non-streamed Response body, as JSON dicts, whatever the recording format.

- ``iter_recorded_streams()`` yields ``(name, [event_dict, ...])``, one per recorded stream.
- ``iter_recorded_responses()`` yields ``(name, response_dict)``, one per non-streamed body.

``name`` is the file name; a cassette with several interactions yields ``name#0``, ``name#1``…
A ``.chunks.txt`` file is one list even when it concatenates several streams (one does:
``sequence_number`` restarts at 0 inside it). The folder is ``$NBRESPONSES_FIXTURES`` when set,
else ``tests/fixtures/recorded`` in the checkout (copies with their licence notices, so a clone
holds everything its tests read).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from helpers.paths import FIXTURES

__all__ = [
    "find_recorded",
    "fixtures_dir",
    "iter_recorded_responses",
    "iter_recorded_streams",
    "parse_sse",
    "recorded_cases",
    "split_streams",
]


class _Loader(yaml.SafeLoader):
    """SafeLoader that also reads YAML 1.2 floats without a dot (``-2e-6``) as floats.

    PyYAML follows YAML 1.1, where ``-2e-6`` is a string; the cassettes hold such logprobs.
    """


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?[0-9][0-9_]*(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"),
)


def fixtures_dir() -> Path:
    """The folder holding the recorded files."""
    env = os.environ.get("NBRESPONSES_FIXTURES")
    path = Path(env) if env else FIXTURES / "recorded"
    if not path.is_dir():
        raise FileNotFoundError(f"recorded fixtures not found at {path}")
    return path


def parse_sse(text: str) -> list[dict[str, Any]]:
    """Events from SSE text: ``data:`` lines joined per block; comments and ``[DONE]`` dropped."""
    events: list[dict[str, Any]] = []
    for block in text.replace("\r\n", "\n").split("\n\n"):
        data = [
            line[5:].removeprefix(" ") for line in block.split("\n") if line.startswith("data:")
        ]
        payload = "\n".join(data).strip()
        if payload and payload != "[DONE]":
            events.append(json.loads(payload))
    return events


def _parse_lines(text: str) -> list[dict[str, Any]]:
    """Events from a ``.chunks.txt`` file: one JSON object per line."""
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def _body(interaction: dict[str, Any]) -> tuple[str, Any] | None:
    """``("events", [...])`` or ``("response", {...})`` for one cassette interaction."""
    response = interaction.get("response") or {}
    if "parsed_body" in response:  # vcrpy, JSON body already parsed
        return "response", response["parsed_body"]
    body = response.get("body")
    if isinstance(body, dict) and "type" in body:  # cassetter
        content = body.get("content")
        if body["type"] == "json":
            return "response", content
        return _classify_text(content or "")
    if isinstance(body, dict) and "string" in body:  # vcrpy, raw text
        return _classify_text(body["string"] or "")
    return None


def _classify_text(text: str) -> tuple[str, Any]:
    stripped = text.lstrip()
    if stripped.startswith("{"):
        return "response", json.loads(stripped)
    return "events", parse_sse(text)


def _cassette_bodies(path: Path) -> list[tuple[str, str, Any]]:
    doc = yaml.load(path.read_text(encoding="utf-8"), Loader=_Loader)
    interactions = doc.get("interactions") or []
    bodies = [b for b in map(_body, interactions) if b is not None]
    if len(bodies) == 1:
        return [(path.name, *bodies[0])]
    return [(f"{path.name}#{i}", kind, value) for i, (kind, value) in enumerate(bodies)]


def _all_bodies() -> Iterator[tuple[str, str, Any]]:
    for path in sorted(fixtures_dir().iterdir()):
        if path.name.endswith(".chunks.txt"):
            yield path.name, "events", _parse_lines(path.read_text(encoding="utf-8"))
        elif path.suffix == ".json":
            yield path.name, "response", json.loads(path.read_text(encoding="utf-8"))
        elif path.suffix in (".yaml", ".yml"):
            yield from _cassette_bodies(path)


def split_streams(events: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """A list holding several streams back to back, split where each ``response.created`` is."""
    streams: list[list[dict[str, Any]]] = []
    for event in events:
        if event.get("type") == "response.created" or not streams:
            streams.append([])
        streams[-1].append(event)
    return streams


def iter_recorded_streams() -> Iterator[tuple[str, list[dict[str, Any]]]]:
    """``(name, events)`` for every recorded stream, events as JSON dicts in arrival order."""
    for name, kind, value in _all_bodies():
        if kind == "events":
            yield name, value


def iter_recorded_responses() -> Iterator[tuple[str, dict[str, Any]]]:
    """``(name, response)`` for every recorded non-streamed Response body, as a JSON dict."""
    for name, kind, value in _all_bodies():
        if kind == "response":
            yield name, value


def recorded_cases() -> list[tuple[str, str, Any]]:
    """``(name, kind, payload)`` of every recording: kind ``events`` (one stream's event dicts;
    a file holding several streams back to back gives ``name#0``, ``name#1``...) or
    ``response``."""
    cases: list[tuple[str, str, Any]] = []
    for name, events in iter_recorded_streams():
        for i, stream in enumerate(split_streams(events)):
            cases.append((f"{name}#{i}", "events", stream))
    cases += [(name, "response", body) for name, body in iter_recorded_responses()]
    return cases


def find_recorded(prefix: str) -> Any:
    """The payload of the first case whose name starts with ``prefix``."""
    return next(payload for name, _, payload in recorded_cases() if name.startswith(prefix))
