"""Recording never destroys: a response a server stored keeps its input, recipe and chain when
a notebook records it from the same file, in either order of the two processes' writes and
across a restart; a recorded response gets its input from the server that kept it, or from
``input=``; every row says where it came from."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
from helpers.responses import MODEL, client_for, prompt_text
from helpers.server import ThreadedServer, scripted

import nbresponses as nbr
from nbresponses.service.database import ResponseDatabase
from nbresponses.service.storage.schema import MIGRATIONS

pytestmark = pytest.mark.timeout(240)

FIRST, SECOND = "What is the capital of France?", "How many people live there?"
PROVENANCE = {"recipe": "int8", "model_hash": "sha256:feed"}
UNREACHABLE = "http://127.0.0.1:9/v1"  # nothing listens there: the input cannot be fetched

# A process serving from the store file (a scripted engine), and a process recording into it.
CHILD = """
import asyncio, json, sys, threading, warnings
from transformers import AutoTokenizer
from helpers.responses import client_for
from nbresponses.service.storage.writer import Write

mode, tokenizer_dir, path = sys.argv[1:4]


async def serve(hold):
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    client, _ = client_for(
        tokenizer, "Paris is the capital.", "About two million.", store_path=path,
        provenance=json.loads(sys.argv[4]),
    )
    gate = threading.Event()
    if hold:  # the writer waits: the recording lands before this process's rows do
        client.store.database._writer.put(Write("", task=lambda db: gate.wait(120)))
    first = await client.responses.create(input=sys.argv[5])
    second = await client.responses.create(input=sys.argv[6], previous_response_id=first.id)
    if not hold:
        assert client.flush()
    print(json.dumps({"first": first.model_dump(mode="json"), "second": second.id}), flush=True)
    sys.stdin.readline()  # the other process recorded the first response
    gate.set()
    client.close()


if mode == "record":
    import nbresponses as nbr
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        nbr.record(json.loads(sys.argv[4]), base_url=sys.argv[5], where=path)
    print(json.dumps([str(w.message) for w in caught]), flush=True)
else:
    asyncio.run(serve(mode == "serve-held"))
"""


def child(*args: str, stdin: bool = False) -> subprocess.Popen:
    paths = [str(Path(__file__).parents[1]), str(Path(__file__).parents[2])]  # tests, the repo
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}
    return subprocess.Popen(
        [sys.executable, "-c", CHILD, *args],
        stdin=subprocess.PIPE if stdin else None,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )


def row_of(path: Path, response_id: str) -> dict:
    with sqlite3.connect(path) as db:
        db.row_factory = sqlite3.Row
        return dict(db.execute("SELECT * FROM responses WHERE id = ?", (response_id,)).fetchone())


def record_in_child(tokenizer_dir: Path, path: Path, response: dict) -> list[str]:
    proc = child("record", str(tokenizer_dir), str(path), json.dumps(response), UNREACHABLE)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0
    return json.loads(out)


@pytest.mark.slow
@pytest.mark.parametrize("order", ["server-first", "recorder-first"])
async def test_recording_a_served_response_changes_none_of_it(
    order, tokenizer, tokenizer_dir, tmp_path
):
    path = tmp_path / "shared.sqlite3"
    held = order == "recorder-first"
    server = child(
        "serve-held" if held else "serve", str(tokenizer_dir), str(path), json.dumps(PROVENANCE),
        FIRST, SECOND, stdin=True,
    )  # fmt: skip
    try:
        made = json.loads(server.stdout.readline())
        first_id = made["first"]["id"]
        before = None if held else row_of(path, first_id)
        caught = record_in_child(tokenizer_dir, path, made["first"])
        server.stdin.write("recorded\n")
        server.stdin.flush()
        assert server.wait(timeout=120) == 0
    finally:
        server.kill()
    after = row_of(path, first_id)
    if before is not None:  # the server's row, as it was: only where and when are added
        assert caught == []  # the file held its input: nothing was asked of the server
        changed = {k for k in after if after[k] != before[k]}
        assert changed == {"origin", "recorded_at", "updated_at"}
    assert after["origin"] == "127.0.0.1:9" and after["recorded_at"] is not None
    assert after["recipe"] == "int8" and after["model_hash"] == "sha256:feed"
    assert json.loads(after["engine"])["timings"]  # the engine's own timings stay
    assert json.loads(after["request"])  # the create parameters stay
    # a restart: the input is listed and the chain continues from both turns
    client, source = client_for(tokenizer, "Yes.", store_path=path)
    try:
        items = await client.responses.input_items.list(first_id)
        assert [i.content[0].text for i in items.data] == [FIRST]
        await client.responses.create(input="Really?", previous_response_id=made["second"])
        prompt = prompt_text(tokenizer, source)
        assert FIRST in prompt and SECOND in prompt and "Paris is the capital." in prompt
    finally:
        client.close()
    frame = nbr.history(path)
    origins = dict(zip(frame["id"], frame["origin"], strict=True))
    assert origins[first_id] == "127.0.0.1:9" and origins[made["second"]] == "engine"
    assert set(origins.values()) == {"127.0.0.1:9", "engine"}


def test_recording_twice_keeps_the_input_the_first_gave(tmp_path):
    """A second recording without input (its server kept none) keeps the first one's."""
    path = tmp_path / "r.sqlite3"
    client_response = _remote_response()
    nbr.record(client_response, input="Name a colour.", base_url="https://api.example.com/v1",
               where=path)  # fmt: skip
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        nbr.record(client_response, base_url="https://api.example.com/v1", where=path)
    assert not caught  # the file holds its input: nothing asked of the server
    frame = nbr.history(path, search="colour")
    assert list(frame["id"]) == [client_response["id"]]
    assert list(frame["origin"]) == ["api.example.com"]


def _remote_response() -> dict:
    return {
        "id": "resp_remote1", "object": "response", "created_at": 1.7e9, "model": "gpt-x",
        "status": "completed", "parallel_tool_calls": True, "tool_choice": "auto", "tools": [],
        "output": [{
            "id": "msg_1", "type": "message", "role": "assistant", "status": "completed",
            "content": [{"type": "output_text", "text": "Blue.", "annotations": []}],
        }],
    }  # fmt: skip


async def test_a_recorded_response_gets_its_input_from_the_server(tokenizer, tmp_path):
    path = tmp_path / "h.sqlite3"
    client, _ = scripted(tokenizer, "Paris is the capital.", "Rome.")
    with ThreadedServer(client) as server:
        sdk = server.openai(sync=True)
        kept = sdk.responses.create(model=MODEL, input=FIRST)
        nbr.record(kept, base_url=f"http://127.0.0.1:{server.port}/v1", where=path)
        unkept = sdk.responses.create(model=MODEL, input="Capital of Italy?", store=False)
        with pytest.warns(UserWarning, match="input="):
            nbr.record(unkept, base_url=f"http://127.0.0.1:{server.port}/v1", where=path)
    assert list(nbr.history(path, search="capital France")["id"]) == [kept.id]
    assert list(nbr.history(path, search="Rome")["input"]) == [""]
    assert set(nbr.history(path)["origin"]) == {f"127.0.0.1:{server.port}"}


async def test_a_shown_stream_is_found_by_its_question(tokenizer, tmp_path, monkeypatch):
    """Fetched from the server that kept it, or given with ``input=`` where it kept none."""
    path = tmp_path / "shown.sqlite3"
    monkeypatch.setenv("NBRESPONSES_STORE", str(path))
    client, _ = scripted(tokenizer, "Paris.", "Rome.")
    with ThreadedServer(client) as server:
        sdk = server.openai()
        stream = await sdk.responses.create(model=MODEL, input="France capital?", stream=True)
        fetched = await nbr.show(stream, record=True).wait()
        stream = await sdk.responses.create(
            model=MODEL, input="Italy capital?", stream=True, store=False
        )
        given = await nbr.show(stream, record=True, input="Italy capital?").wait()
    assert list(nbr.history(path, search="France")["id"]) == [fetched.id]
    assert list(nbr.history(path, search="Italy")["id"]) == [given.id]
    assert list(nbr.history(path, origin=f"127.0.0.1:{server.port}")["id"]) == [
        given.id, fetched.id,
    ]  # fmt: skip
    assert nbr.history(path, origin="engine").empty


async def test_history_shows_and_filters_the_origin_of_every_row(tokenizer, tmp_path):
    path = tmp_path / "o.sqlite3"
    client, _ = client_for(tokenizer, "Local answer.", store_path=path)
    try:
        local = await client.responses.create(input="Made here?")
        assert client.flush()
    finally:
        client.close()
    url = "https://api.example.com:8443/v1?key=sk-x"
    nbr.record(_remote_response(), input="Name a colour.", base_url=url, where=path)
    frame = nbr.history(path)
    assert dict(zip(frame["id"], frame["origin"], strict=True)) == {
        local.id: "engine", "resp_remote1": "api.example.com:8443",
    }  # fmt: skip
    assert list(nbr.history(path, origin="engine")["id"]) == [local.id]
    assert list(nbr.history(path, origin="api.example.com:8443")["id"]) == ["resp_remote1"]
    assert not frame.astype(str).apply(lambda c: c.str.contains("sk-x")).any().any()


def test_a_file_from_before_origins_reads_its_hosts(tmp_path):
    """Migration 2: rows recorded before it take their host from the engine column."""
    path = tmp_path / "old.sqlite3"
    with sqlite3.connect(path) as db:
        db.executescript(MIGRATIONS[0])
        db.execute("PRAGMA user_version=1")
        for n, engine in enumerate(['{"source":"remote","host":"h:1","model":"m"}', "{}"]):
            db.execute(
                "INSERT INTO responses (id, created_at, updated_at, status, response, input, "
                "engine, size) VALUES (?, ?, ?, 'completed', '{}', '[]', ?, 0)",
                (f"resp_{n}", 1.0 + n, 5.0, engine),
            )
    ResponseDatabase(path).close()
    with sqlite3.connect(path) as db:
        rows = db.execute("SELECT id, origin, recorded_at FROM responses ORDER BY id").fetchall()
    assert rows == [("resp_0", "h:1", 5.0), ("resp_1", "engine", None)]
