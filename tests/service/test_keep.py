"""``nbr.record``: a response made by a remote server joins the history, with the server's
host and model as its provenance, and no key."""

from __future__ import annotations

import json
import sqlite3

import pytest
from helpers.responses import MODEL
from helpers.server import ThreadedServer, scripted

import nbresponses as nbr

pytestmark = pytest.mark.timeout(60)


def test_a_remote_response_is_kept_with_its_provenance(tokenizer, tmp_path):
    client, _ = scripted(tokenizer, "Paris is the capital.")
    store = tmp_path / "history.sqlite3"
    with ThreadedServer(client) as server:
        sdk = server.openai(sync=True)
        response = sdk.responses.create(model=MODEL, input="What is the capital of France?")
        secret = f"http://user:sk-secret@127.0.0.1:{server.port}/v1?api_key=sk-secret"
        kept = nbr.record(
            response, input="What is the capital of France?", base_url=secret, where=store
        )
    assert kept == response.id
    frame = nbr.history(store)
    row = frame.set_index("id").loc[response.id]
    assert row["model"] == MODEL and row["output"] == "Paris is the capital."
    assert row["input"] == "What is the capital of France?" and row["status"] == "completed"
    assert len(nbr.history(store, search="capital France")) == 1
    with sqlite3.connect(store) as db:
        engine, *columns = db.execute("SELECT engine, * FROM responses").fetchone()
    assert json.loads(engine) == {
        "source": "remote", "host": f"127.0.0.1:{server.port}", "model": MODEL, "timings": {},
    }  # fmt: skip
    assert not any("sk-secret" in str(value) for value in columns)  # the key is never kept
    with pytest.raises(TypeError):
        nbr.record(3, where=store)


async def test_show_keeps_a_remote_stream_only_when_asked(tokenizer, tmp_path, monkeypatch):
    store = tmp_path / "shown.sqlite3"
    monkeypatch.setenv("NBRESPONSES_STORE", str(store))
    client, _ = scripted(tokenizer, "Paris.", "Rome.")
    with ThreadedServer(client) as server:
        sdk = server.openai()
        stream = await sdk.responses.create(model=MODEL, input="France?", stream=True)
        kept = await nbr.show(stream, record=True).wait()
        other = await sdk.responses.create(model=MODEL, input="Italy?", stream=True)
        shown = await nbr.show(other).wait()
    frame = nbr.history(store)
    assert list(frame["id"]) == [kept.id] and shown.id != kept.id
    assert list(frame["output"]) == ["Paris."]
    with sqlite3.connect(store) as db:
        (engine,) = db.execute("SELECT engine FROM responses").fetchone()
    assert json.loads(engine)["host"] == f"127.0.0.1:{server.port}"
