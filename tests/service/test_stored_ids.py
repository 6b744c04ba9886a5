"""A response store registers itself where frames look ids up: a stored response's id reads
as the Response itself, however the frames were imported, whether the store keeps a file or
memory only, and through ``lookup=`` a store given explicitly."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from helpers.responses import client_for

import nbresponses as nbr
from nbresponses.frames import logprobs_frame

TESTS = Path(__file__).resolve().parents[1]

# the two ways a user reaches the frames, each run first in a fresh process
IMPORTS = {
    "package": "import nbresponses as nbr\nlogprobs_frame = nbr.logprobs_frame\n",
    "frames": "from nbresponses.frames import logprobs_frame\n",
}

STORED = """
import asyncio
import sys

import pandas as pd
from helpers.responses import client_for

from nbresponses.models.tokenizer import StoredTokenizer


async def main() -> None:
    tokenizer = StoredTokenizer.load(sys.argv[1])
    client, _ = client_for(tokenizer, "Paris is the capital.", store_path=sys.argv[2])
    made = await client.responses.create(
        input="France?", include=["message.output_text.logprobs"], top_logprobs=2
    )
    direct = logprobs_frame(made)
    assert len(direct) > 3, direct
    pd.testing.assert_frame_equal(logprobs_frame(made.id), direct)
    pd.testing.assert_frame_equal(logprobs_frame([made.id, made.id]), logprobs_frame([made, made]))
    client.close()
    print("read by id")


asyncio.run(main())
"""


@pytest.mark.parametrize("imported", sorted(IMPORTS))
def test_a_stored_id_reads_as_its_response_however_frames_are_imported(
    imported: str, tokenizer_dir: Path, tmp_path: Path
) -> None:
    db_path = tmp_path / "responses.sqlite3"
    code = IMPORTS[imported] + STORED
    out = subprocess.run(
        [sys.executable, "-W", "error::UserWarning", "-c", code, str(tokenizer_dir), str(db_path)],
        cwd=TESTS,  # for the helpers package
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0 and out.stdout.strip() == "read by id", out.stdout + out.stderr


async def test_a_memory_store_is_read_by_id_and_a_store_passed_as_lookup(tokenizer) -> None:
    kept, _ = client_for(tokenizer, "Paris is the capital.", store_path="memory")
    made = await kept.responses.create(
        input="France?", include=["message.output_text.logprobs"], top_logprobs=2
    )
    direct = logprobs_frame(made)
    assert len(direct) > 3
    pd.testing.assert_frame_equal(logprobs_frame(made.id), direct)
    pd.testing.assert_frame_equal(logprobs_frame(made.id, lookup=kept.store), direct)
    other, _ = client_for(tokenizer, "unused", store_path="memory")
    with pytest.raises(KeyError, match=rf"{made.id}.*looked in <ResponseStore: 0 responses"):
        logprobs_frame(made.id, lookup=other.store)


async def test_a_closed_store_answers_from_memory_and_leaves_when_collected(
    tokenizer, tmp_path
) -> None:
    import gc
    import weakref

    client, _ = client_for(tokenizer, "Paris.", store_path=tmp_path / "responses.sqlite3")
    made = await client.responses.create(input="France?", include=["message.output_text.logprobs"])
    client.close()
    assert "(closed)" in repr(client.store)
    pd.testing.assert_frame_equal(nbr.logprobs_frame(made.id), nbr.logprobs_frame(made))
    gone = weakref.ref(client.store)
    del client
    gc.collect()
    assert gone() is None
    with pytest.raises(KeyError, match=made.id):  # the file is not the default one
        nbr.logprobs_frame(made.id)
