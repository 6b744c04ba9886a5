"""``nbr.record``: a response made by a remote server joins the history, with the server's
host and model as its provenance, and no key."""

from __future__ import annotations

import json
import sqlite3

import pytest
from helpers.server import MODEL, ThreadedServer, scripted

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
