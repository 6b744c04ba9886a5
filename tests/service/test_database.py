"""The SQLite response store: what is stored comes back after a restart, equal and whole."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import inspect
import json
import os
import signal
import sqlite3
import subprocess
import sys
import tracemalloc
import warnings
import weakref
from pathlib import Path

import pytest
from helpers.responses import client_for
from openai.types.responses import Response

from nbresponses.engine import Engine
from nbresponses.service.database import ResponseDatabase, StoreWarning
from nbresponses.service.storage.errors import StoreError
from nbresponses.service.storage.schema import MIGRATIONS
from nbresponses.service.store import STORE_DEFAULTS


@pytest.fixture
def db_path(tmp_path):
    return tmp_path / "responses.sqlite3"


def reopen(tokenizer, db_path, *scripts, **kw):
    """A new client on the same file: what a restarted kernel sees."""
    client, source = client_for(tokenizer, *(scripts or ("unused",)), store_path=db_path, **kw)
    return client, source


@pytest.fixture
def clients():
    opened = []
    yield opened
    for client in opened:
        client.close()


def open_client(clients, tokenizer, db_path, *scripts, **kw):
    client, source = reopen(tokenizer, db_path, *scripts, **kw)
    clients.append(client)
    return client, source


async def test_a_response_comes_back_equal_after_a_restart(tokenizer, db_path, clients):
    first, _ = open_client(clients, tokenizer, db_path, "Paris is the capital.")
    made = await first.responses.create(
        input="Capital of France?", include=["message.output_text.logprobs"], top_logprobs=3,
        metadata={"run": "a"},
    )  # fmt: skip
    assert first.flush()
    first.close()
    second, _ = open_client(clients, tokenizer, db_path)
    back = await second.responses.retrieve(made.id)
    assert isinstance(back, Response)
    assert back == made
    assert back.model_dump_json() == made.model_dump_json()
    assert back.output[0].content[0].logprobs[0].top_logprobs  # alternatives kept
    items = await second.responses.input_items.list(made.id)
    assert [i.content[0].text for i in items.data] == ["Capital of France?"]


async def test_a_chain_continues_across_a_restart(tokenizer, db_path, clients):
    first, _ = open_client(clients, tokenizer, db_path, "One.", "Two.")
    a = await first.responses.create(input="first", instructions="Be short.")
    b = await first.responses.create(input="second", previous_response_id=a.id)
    first.close()
    second, source = open_client(clients, tokenizer, db_path, "Three.")
    c = await second.responses.create(input="third", previous_response_id=b.id)
    prompt = tokenizer.decode(source.prompts[-1])
    for text in ("first", "One.", "second", "Two.", "third"):
        assert text in prompt
    assert prompt.index("first") < prompt.index("Two.") < prompt.index("third")
    assert c.status == "completed"


async def test_delete_keeps_what_a_child_needs(tokenizer, db_path, clients):
    client, source = open_client(clients, tokenizer, db_path, "One.", "Two.", "Three.")
    a = await client.responses.create(input="first")
    b = await client.responses.create(input="second", previous_response_id=a.id)
    await client.responses.delete(a.id)
    client.close()
    again, source = open_client(clients, tokenizer, db_path, "Three.")
    with pytest.raises(Exception, match="not found"):
        await again.responses.retrieve(a.id)
    c = await again.responses.create(input="third", previous_response_id=b.id)
    assert "first" in tokenizer.decode(source.prompts[-1])  # the deleted parent's turn
    await again.responses.delete(b.id)
    assert again.flush()
    rows = sqlite3.connect(db_path).execute("SELECT COUNT(*) FROM responses").fetchone()[0]
    assert rows == 3  # a and b hidden: c continues from them
    await again.responses.delete(c.id)
    assert again.flush()
    rows = sqlite3.connect(db_path).execute("SELECT COUNT(*) FROM responses").fetchone()[0]
    assert rows == 0  # with its last child gone, the hidden parent went too


async def test_store_false_writes_nothing(tokenizer, db_path, clients):
    client, _ = open_client(clients, tokenizer, db_path, "a")
    await client.responses.create(input="x", store=False)
    assert client.flush()
    assert sqlite3.connect(db_path).execute("SELECT COUNT(*) FROM responses").fetchone()[0] == 0


async def test_background_events_replay_after_a_restart(tokenizer, db_path, clients):
    client, _ = open_client(clients, tokenizer, db_path, "Hello there, friend.")
    r = await client.responses.create(input="hi", background=True)
    await client.store.get(r.id).run.wait()
    stream = await client.responses.retrieve(r.id, stream=True)
    live = [e async for e in stream]
    client.close()
    again, _ = open_client(clients, tokenizer, db_path)
    stream = await again.responses.retrieve(r.id, stream=True, starting_after=2)
    replayed = [e async for e in stream]
    assert replayed == live[3:]
    assert (await again.responses.cancel(r.id)).status == "completed"  # finished: no-op


async def test_an_evicted_response_is_read_back_from_disk(tokenizer, db_path, clients):
    client, _ = open_client(clients, tokenizer, db_path, "a", store_max_responses=2)
    made = [await client.responses.create(input=f"q{i}") for i in range(5)]
    assert len(client.store) == 2
    for response in made:
        assert await client.responses.retrieve(response.id) == response


async def test_history_search_and_filters(tokenizer, db_path, clients):
    from nbresponses.service.history import history

    client, _ = open_client(clients, tokenizer, db_path, "The walrus sings.", "Cats sleep.")
    a = await client.responses.create(input="tell me about walruses", metadata={"topic": "sea"})
    b = await client.responses.create(input="and cats?", metadata={"topic": "land"})
    assert client.flush()
    frame = history(db_path)
    assert list(frame["id"]) == [b.id, a.id]  # newest first
    assert frame.loc[0, "output"] == "Cats sleep."
    assert list(history(db_path, search="walrus")["id"]) == [a.id]
    assert list(history(db_path, search="sings")["id"]) == [a.id]
    assert list(history(db_path, metadata={"topic": "land"})["id"]) == [b.id]
    assert history(db_path, status="failed").empty
    assert list(history(db_path, since=a.created_at, until=a.created_at)["id"]) == [a.id]
    assert int(frame.loc[1, "output_tokens"]) == a.usage.output_tokens


CHILD = r"""
import asyncio, json, sys
from pathlib import Path
from transformers import AutoTokenizer
from helpers.responses import client_for, ids
from nbresponses.tokens.scripted import Script

mode, tokenizer_dir, path = sys.argv[1:4]
tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)


async def crash():
    slow = Script(ids(tokenizer, "x " * 2000), delay=0.01)
    client, _ = client_for(tokenizer, "Done one.", "Done two.", slow, store_path=path)
    done = [(await client.responses.create(input=f"q{i}")).id for i in range(2)]
    stream = await client.responses.create(input="long", background=True, stream=True)
    async for event in stream:
        if event.type == "response.output_text.delta":
            break
    client.flush()
    print(json.dumps({"done": done, "running": stream.response_id}), flush=True)
    await asyncio.sleep(600)  # killed here


async def write(count, tag):
    client, _ = client_for(tokenizer, "An answer.", store_path=path)
    for i in range(count):
        await client.responses.create(input=f"{tag} {i}", metadata={"proc": tag})
    client.close()


if mode == "crash":
    asyncio.run(crash())
else:
    asyncio.run(write(int(sys.argv[4]), sys.argv[5]))
"""


def child(mode, tokenizer_dir, db_path, *args):
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[1])}
    return subprocess.Popen(
        [sys.executable, "-c", CHILD, mode, str(tokenizer_dir), str(db_path), *map(str, args)],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )


@pytest.mark.slow
async def test_kill_9_mid_stream(tokenizer, tokenizer_dir, db_path, clients):
    """The writing process dies mid-stream: the file is intact, what finished is whole, and
    the response it was generating reads back as failed with the reason."""
    proc = child("crash", tokenizer_dir, db_path)
    try:
        line = proc.stdout.readline()
        assert line, "the child process ended before it was ready"
        state = json.loads(line)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        proc.kill()
    with sqlite3.connect(db_path) as db:
        assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    client, _ = open_client(clients, tokenizer, db_path)
    for response_id in state["done"]:
        done = await client.responses.retrieve(response_id)
        assert done.status == "completed" and done.output_text.startswith("Done")
    cut = await client.responses.retrieve(state["running"])
    assert cut.status == "failed"
    assert cut.error.code == "server_error" and "ended before it finished" in cut.error.message
    assert client.flush()
    with sqlite3.connect(db_path) as db:  # written back as failed, not only read so
        assert db.execute(
            "SELECT status FROM responses WHERE id = ?", (state["running"],)
        ).fetchone()[0] == "failed"  # fmt: skip


@pytest.mark.slow
async def test_two_processes_write_at_once(tokenizer, tokenizer_dir, db_path, clients):
    procs = [child("write", tokenizer_dir, db_path, 150, tag) for tag in ("a", "b")]
    for proc in procs:
        assert proc.wait(timeout=240) == 0
    with sqlite3.connect(db_path) as db:
        query = (
            "SELECT json_extract(metadata, '$.proc'), COUNT(*) FROM responses "
            "WHERE status = 'completed' GROUP BY 1"
        )
        counts = dict(db.execute(query).fetchall())
        assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    assert counts == {"a": 150, "b": 150}


def test_migrations_run_once_and_keep_data(db_path, monkeypatch):
    database = ResponseDatabase(db_path)
    database.close()
    with sqlite3.connect(db_path) as db:
        assert db.execute("PRAGMA user_version").fetchone()[0] == len(MIGRATIONS)
    monkeypatch.setattr(
        "nbresponses.service.storage.schema.MIGRATIONS",
        [*MIGRATIONS, "ALTER TABLE responses ADD COLUMN note TEXT;"],
    )
    ResponseDatabase(db_path).close()
    ResponseDatabase(db_path).close()  # already at the new version: nothing runs twice
    with sqlite3.connect(db_path) as db:
        assert db.execute("PRAGMA user_version").fetchone()[0] == len(MIGRATIONS) + 1
        columns = [r[1] for r in db.execute("PRAGMA table_info(responses)")]
    assert "note" in columns


def test_a_newer_or_corrupt_file_is_left_alone(tokenizer, tmp_path):
    newer = tmp_path / "newer.sqlite3"
    with sqlite3.connect(newer) as db:
        db.execute("PRAGMA user_version = 99")
    corrupt = tmp_path / "corrupt.sqlite3"
    corrupt.write_bytes(b"this is not a database at all, but a user's file" * 100)
    before = corrupt.read_bytes()
    for path in (newer, corrupt):
        with pytest.warns(StoreWarning):
            client, _ = client_for(tokenizer, "a", store_path=path)
        assert client.store.database is None  # in memory, working
    assert corrupt.read_bytes() == before
    with sqlite3.connect(newer) as db:
        assert db.execute("PRAGMA user_version").fetchone()[0] == 99


async def test_a_full_disk_warns_and_generation_goes_on(tokenizer, db_path, clients):
    client, _ = open_client(clients, tokenizer, db_path, "x " * 400)
    first = await client.responses.create(input="fits")
    assert client.flush()
    database = client.store.database
    pages = database.query("PRAGMA page_count")[0][0]
    database.in_writer(lambda db: db.execute(f"PRAGMA max_page_count = {pages}"))  # now full
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        made = [
            await client.responses.create(input="big " * 300, metadata={"n": str(i)})
            for i in range(3)
        ]
        assert not client.flush(timeout=5)
    assert any(issubclass(w.category, StoreWarning) and "full" in str(w.message) for w in caught)
    assert all(r.status == "completed" for r in made)
    assert await client.responses.retrieve(made[0].id) == made[0]  # held in memory
    assert database.stats()["error"]
    database.in_writer(lambda db: db.execute("PRAGMA max_page_count = 1073741823"))  # space
    assert client.flush(timeout=10)  # the failed writes were retried
    client.close()
    again, _ = open_client(clients, tokenizer, db_path)
    for response in (first, *made):
        assert await again.responses.retrieve(response.id) == response
    assert sqlite3.connect(db_path).execute("PRAGMA integrity_check").fetchone()[0] == "ok"


async def test_a_locked_database_is_retried(tokenizer, db_path, clients):
    client, _ = open_client(clients, tokenizer, db_path, "a")
    client.store.database.in_writer(lambda db: db.execute("PRAGMA busy_timeout = 100"))
    other = sqlite3.connect(db_path, isolation_level=None)
    other.execute("BEGIN EXCLUSIVE")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        r = await client.responses.create(input="x")
        assert not client.flush(timeout=3)
    assert any("locked" in str(w.message) for w in caught)
    other.execute("COMMIT")
    assert client.flush(timeout=10)
    row = sqlite3.connect(db_path).execute("SELECT status FROM responses").fetchone()
    assert row[0] == "completed" and r.status == "completed"


def test_opening_a_file_another_connection_is_writing_waits_for_it(db_path):
    """A new file still in its first (rollback) journal with another connection's write lock
    on it, as when a second process opens it while the first creates it: SQLite answers the
    switch to WAL with "database is locked" at once, without waiting. The store waits for the
    lock (up to its busy timeout) instead of falling back to memory, where what it kept would
    be lost at exit; a lock held past the timeout is still an error."""
    import threading
    import time

    other = sqlite3.connect(db_path, isolation_level=None, check_same_thread=False)
    other.execute("CREATE TABLE t (x)")
    other.execute("BEGIN IMMEDIATE")
    other.execute("INSERT INTO t VALUES (1)")
    release = threading.Timer(0.3, lambda: other.execute("COMMIT"))
    release.start()
    start = time.monotonic()
    database = ResponseDatabase(db_path, busy_timeout=5.0)
    try:
        assert time.monotonic() - start >= 0.25  # it waited for the lock
        mode = sqlite3.connect(db_path).execute("PRAGMA journal_mode").fetchone()[0]
        assert mode == "wal"
    finally:
        database.close()
        release.join()
    held = db_path.with_name("held.sqlite3")
    other = sqlite3.connect(held, isolation_level=None)
    other.execute("CREATE TABLE t (x)")
    other.execute("BEGIN IMMEDIATE")
    other.execute("INSERT INTO t VALUES (1)")
    start = time.monotonic()
    with pytest.raises(StoreError, match="locked") as caught:
        ResponseDatabase(held, busy_timeout=0.2)
    assert 0.2 <= time.monotonic() - start < 3
    other.execute("ROLLBACK")
    other.close()
    # the failed connection was closed, not left open on the file (while the error and its
    # frames live): SQLite closes a closed connection's descriptor once the file's other
    # connections in this process are gone too
    held_path = str(held.resolve())
    open_on_held = []
    descriptors = Path("/proc/self/fd")  # Linux's; elsewhere nothing to read
    for fd in descriptors.iterdir() if descriptors.is_dir() else ():
        with contextlib.suppress(OSError):  # the directory's own descriptor, gone as it is read
            open_on_held.append(os.readlink(fd) == held_path)
    assert not any(open_on_held), caught


async def test_a_read_only_database_still_reads(tokenizer, db_path, clients):
    client, _ = open_client(clients, tokenizer, db_path, "a", store_max_responses=1)
    old = await client.responses.create(input="before")
    assert client.flush()
    database = client.store.database
    database.in_writer(lambda db: db.execute("PRAGMA query_only = 1"))  # SQLITE_READONLY now
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        new = await client.responses.create(input="after")
        client.flush(timeout=5)
    assert any("read-only" in str(w.message) for w in caught)
    assert new.status == "completed" and not database.writable
    assert await client.responses.retrieve(new.id) == new  # in memory
    assert await client.responses.retrieve(old.id) == old  # evicted: read from the file


def _mount_tmpfs(path, size):
    path.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                          capture_output=True)  # fmt: skip
    return done.returncode == 0


@pytest.mark.slow
async def test_a_really_full_disk(tokenizer, tmp_path, clients):
    """ENOSPC from the file system itself (a 512 KiB tmpfs), not only SQLite's page limit."""
    disk = tmp_path / "disk"
    if not _mount_tmpfs(disk, "512k"):
        pytest.skip("cannot mount a small tmpfs here (needs root): the page-limit test covers it")
    try:
        client, _ = open_client(clients, tokenizer, disk / "r.sqlite3", "word " * 2000)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            made = [await client.responses.create(input=f"q{i}") for i in range(60)]
            client.flush(timeout=5)
        assert all(r.status == "completed" for r in made)
        assert any("full" in str(w.message) for w in caught)
        for response in made:
            assert await client.responses.retrieve(response.id) == response
        client.close()
        with sqlite3.connect(disk / "r.sqlite3") as db:
            assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
            assert db.execute("SELECT COUNT(*) FROM responses").fetchone()[0] > 0
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


async def test_retention_by_age_and_size(tokenizer, db_path, clients):
    client, _ = open_client(clients, tokenizer, db_path, "a")
    made = [await client.responses.create(input=f"q{i}") for i in range(6)]
    assert client.flush()
    client.close()
    with sqlite3.connect(db_path) as db:
        db.execute("UPDATE responses SET created_at = created_at - 40 * 86400 WHERE id = ?",
                   (made[0].id,))  # fmt: skip
        sizes = [r[0] for r in db.execute("SELECT size FROM responses ORDER BY created_at")]
    kept, _ = open_client(
        clients, tokenizer, db_path, store_keep_days=30, store_max_disk_bytes=sum(sizes[3:])
    )
    assert kept.flush()
    query = "SELECT id FROM responses ORDER BY created_at"
    left = [r[0] for r in sqlite3.connect(db_path).execute(query)]
    assert left == [r.id for r in made[3:]]  # the oldest went first, the 40-day one too
    with sqlite3.connect(db_path) as db:  # freed pages go back to the disk
        assert db.execute("PRAGMA auto_vacuum").fetchone()[0] == 2  # incremental


async def test_off_keeps_nothing(tokenizer):
    client, _ = client_for(tokenizer, "a", store_path="off")
    r = await client.responses.create(input="x")
    with pytest.raises(Exception, match="not found"):
        await client.responses.retrieve(r.id)
    with pytest.raises(Exception, match=r"(?i)background"):
        await client.responses.create(input="x", background=True)


def test_the_store_defaults_as_documented(tokenizer):
    """One place for them (``StoreDefaults``): the engine keeps the user's file, a bare client
    this process's memory, both with the bounds docs/concepts/engine.md gives."""
    client, _ = client_for(tokenizer, "a")
    assert client.keeps and client.store.database is None  # "memory"
    bounds = (client.store.max_responses, client.store.max_bytes)
    assert bounds == (STORE_DEFAULTS.max_responses, STORE_DEFAULTS.max_bytes) == (1000, 64 << 20)
    load = inspect.signature(Engine.load).parameters
    assert load["store_path"].default is None and STORE_DEFAULTS.engine_path is None
    assert (load["store_max_responses"].default, load["store_max_bytes"].default) == bounds


def test_rows_hold_the_provenance(tokenizer, db_path, clients):
    async def go():
        client, _ = open_client(
            clients, tokenizer, db_path, "a", provenance={"recipe": "q8", "model_hash": "abc"}
        )
        await client.responses.create(input="x")
        assert client.flush()

    asyncio.run(go())
    recipe, digest, engine = (
        sqlite3.connect(db_path)
        .execute("SELECT recipe, model_hash, engine FROM responses")
        .fetchone()
    )
    assert (recipe, digest) == ("q8", "abc")
    assert "wall_s" in json.loads(engine)["timings"]


@pytest.mark.slow
async def test_frames_read_ids_and_history_frames(tokenizer, db_path, clients, monkeypatch):
    import pandas as pd

    import nbresponses as nbr
    from nbresponses.service.history import history

    client, _ = open_client(clients, tokenizer, db_path, "Paris is the capital.", "Rome.")
    made = [
        await client.responses.create(
            input=q, include=["message.output_text.logprobs"], top_logprobs=2
        )
        for q in ("France?", "Italy?")
    ]
    direct = nbr.logprobs_frame(made)
    pd.testing.assert_frame_equal(nbr.logprobs_frame([r.id for r in made]), direct)
    by_history = nbr.logprobs_frame(history(db_path).iloc[::-1])  # oldest first, as made
    pd.testing.assert_frame_equal(by_history, direct)
    with pytest.raises(KeyError, match="resp_nowhere"):
        nbr.logprobs_frame("resp_nowhere")
    client.close()
    monkeypatch.setenv("NBRESPONSES_STORE", str(db_path))  # a new kernel: the default file
    clients.remove(client)
    gone = weakref.ref(client.store)
    del client
    gc.collect()
    assert gone() is None  # no store holds it any more: the file answers
    pd.testing.assert_frame_equal(nbr.logprobs_frame(made[0].id), nbr.logprobs_frame(made[0]))


OURS = [tracemalloc.Filter(True, "*/nbresponses/*", all_frames=True)]


@pytest.mark.slow
async def test_memory_stays_flat_over_a_thousand_stored_responses(tokenizer, db_path, clients):
    client, source = open_client(
        clients, tokenizer, db_path, "An answer of a few words.", store_max_responses=20
    )

    async def requests(count):
        for i in range(count):
            await client.responses.create(input=f"question {i}")
        source.prompts.clear()  # the test double's own record
        source.params.clear()
        assert client.flush()
        gc.collect()
        return tracemalloc.take_snapshot().filter_traces(OURS) if tracemalloc.is_tracing() else None

    await requests(100)  # warm: first-call caches
    tracemalloc.start(16)  # what nbresponses code allocated (not other tests' threads)
    try:
        after_200 = await requests(200)
        after_1000 = await requests(800)
    finally:
        tracemalloc.stop()
    grown = after_1000.compare_to(after_200, "traceback")
    total = sum(g.size_diff for g in grown)
    top = "\n".join(f"{g.size_diff} B\n" + "\n".join(g.traceback.format()) for g in grown[:3])
    assert total < 100_000, f"{total} B more after 800 more responses:\n{top}"  # one is ~5 KB
    assert client.store.database.count() == 1100 and len(client.store) == 20


async def test_a_structured_response_comes_back_with_its_schema(tokenizer, db_path, clients):
    """``text.format.schema`` is the SDK's ``schema_`` field under the alias ``schema``: stored
    and streamed by alias, it survives the restart (it once came back as a load error)."""
    from helpers.responses import check_stream, stream_events

    schema = {
        "type": "object",
        "properties": {"a": {"type": "integer"}},
        "required": ["a"],
        "additionalProperties": False,
    }
    text = {"format": {"type": "json_schema", "name": "thing", "schema": schema, "strict": True}}
    first, _ = open_client(clients, tokenizer, db_path, '{"a": 1}')
    events = await stream_events(first, input="a thing", text=text)
    check_stream(events)
    made = events[-1].response
    assert made.text.format.schema_ == schema
    first.close()
    second, _ = open_client(clients, tokenizer, db_path)
    back = await second.responses.retrieve(made.id)
    assert back == made and back.text.format.schema_ == schema
    assert '"schema":' in back.model_dump_json(by_alias=True)
