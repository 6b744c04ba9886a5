"""What keeping every response in SQLite costs, and how it answers at 100,000 responses.

1. Write cost per response, on the real engine (the bundled model, batch 1, greedy, 128 tokens
   with ``top_logprobs``): the event loop's share (the row as started) and the writer
   thread's (the final row built and upserted, batched), in µs and as a share of the time
   the response took to generate. The writer runs beside the decode thread on its own core
   share; it never blocks the loop.
2. A store of ``--responses`` rows (default 100,000; a few percent with logprobs, as a
   notebook's history is): fill time and file size; ``retrieve`` of a random id read back
   from the file (not the memory cache) in a fresh client; ``nbr.history()`` with no filter,
   a status filter, a metadata filter, a time range and full-text search.

    python benchmarks/store.py [--responses 100000] [--keep DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import nbresponses as nbr
from nbresponses.service.client import AsyncResponsesClient
from nbresponses.service.codec import to_row
from nbresponses.service.database import ResponseDatabase
from nbresponses.service.history import history
from nbresponses.tokens.scripted import ScriptedTokenSource

WORDS = [
    "model", "token", "logprob", "walrus", "notebook", "kernel", "stream", "answer", "question",
    "batch", "decode", "prefix", "cache", "engine", "river", "mountain", "paris", "rome",
    "berlin", "tokyo", "sample", "greedy", "entropy",
]  # fmt: skip


async def write_cost(path: Path, count: int) -> dict[str, float]:
    """The real engine; each create timed, and the store's two sides timed per response."""
    engine = await nbr.Engine.load(store_path=path, progress=False)
    client = engine.client()
    store = client.store
    loop_seconds: list[float] = []
    put = store.put

    def timed_put(record: Any) -> None:
        started = time.perf_counter()
        put(record)
        loop_seconds.append(time.perf_counter() - started)

    store.put = timed_put  # type: ignore[method-assign]
    generation: list[float] = []
    writer: list[float] = []
    for i in range(count):
        started = time.perf_counter()
        response = await client.responses.create(
            input=f"Write a short story about a {random.choice(WORDS)} ({i}).",
            max_output_tokens=128,
            temperature=0,
            include=["message.output_text.logprobs"],
            top_logprobs=5,
        )
        generation.append(time.perf_counter() - started)
        record = store.get(response.id)
        assert record is not None
        started = time.perf_counter()
        to_row(record)  # what the writer builds for it (measured alone, then written batched)
        writer.append(time.perf_counter() - started)
    assert client.flush()
    database = store.database
    assert database is not None
    stats = database.stats()
    await engine.aclose()
    tokens = response.usage.output_tokens if response.usage else 0
    return {
        "generation_ms": 1000 * statistics.median(generation),
        "tokens": tokens,
        "loop_us": 1e6 * statistics.median(loop_seconds),
        "build_us": 1e6 * statistics.median(writer),
        "writer_us": 1e6 * stats["write_seconds"] / count,  # its rows as started and as ended
    }


def templates(count: int) -> list[dict[str, Any]]:
    """Rows of real stored responses (the scripted source; some with top-5 logprobs)."""

    async def make() -> list[dict[str, Any]]:
        tokenizer = _tokenizer()
        rows = []
        for i in range(count):
            text = " ".join(random.choices(WORDS, k=random.randint(20, 120)))
            source = ScriptedTokenSource([[*tokenizer.encode(text), 2]])
            client = AsyncResponsesClient(source, tokenizer, model="smollm2")
            logprobs = i % 25 == 0  # 4%: the ones a user asked logprobs of
            r = await client.responses.create(
                input=" ".join(random.choices(WORDS, k=12)),
                metadata={"experiment": f"e{i % 10}"},
                **(
                    {"include": ["message.output_text.logprobs"], "top_logprobs": 5}
                    if logprobs
                    else {}
                ),
            )
            record = client.store.get(r.id)
            assert record is not None
            rows.append(to_row(record))
        return rows

    return asyncio.run(make())


def _tokenizer() -> Any:
    from transformers import AutoTokenizer

    from nbresponses.models.prepare import tokenizer_folder

    return AutoTokenizer.from_pretrained(str(tokenizer_folder()))


def fill(path: Path, count: int) -> tuple[list[str], float]:
    rows = templates(50)
    database = ResponseDatabase(path)
    ids = []
    start_time = time.time() - 86400 * 30
    started = time.perf_counter()
    for i in range(count):
        template = rows[i % len(rows)]
        new_id = f"resp_{i:048x}"
        rare = " narwhal" if i % 1000 == 0 else ""  # a word in 0.1% of the rows
        row = {
            **template,
            "input_text": template["input_text"] + rare,
            "id": new_id,
            "created_at": start_time + i * (86400 * 30 / count),
            "response": template["response"].replace(template["id"], new_id),
        }
        database.write(new_id, lambda row=row: row)
        ids.append(new_id)
        if i % 5000 == 4999:
            database.flush(timeout=None)
    assert database.flush(timeout=None)
    elapsed = time.perf_counter() - started
    database.close()
    return ids, elapsed


def timed(fn: Any, repeat: int = 5) -> float:
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return 1000 * statistics.median(times)


async def queries(path: Path, ids: list[str]) -> dict[str, float]:
    source = ScriptedTokenSource([[2]])
    client = AsyncResponsesClient(source, _tokenizer(), model="smollm2", store_path=path)
    sample = random.sample(ids, 200)
    retrieve = []
    for response_id in sample:
        started = time.perf_counter()
        await client.responses.retrieve(response_id)
        retrieve.append(time.perf_counter() - started)
        client.store._records.clear()  # measure the file, not the memory cache
    client.close()
    middle = time.time() - 86400 * 15
    retrieve.sort()
    return {
        "retrieve_p50_ms": 1000 * retrieve[len(retrieve) // 2],
        "retrieve_p95_ms": 1000 * retrieve[int(len(retrieve) * 0.95)],
        "history_1000_ms": timed(lambda: history(path)),
        "history_status_ms": timed(lambda: history(path, status="completed", limit=100)),
        "history_metadata_ms": timed(lambda: history(path, metadata={"experiment": "e3"})),
        "history_day_ms": timed(lambda: history(path, since=middle, until=middle + 86400)),
        "history_search_rare_ms": timed(lambda: history(path, search="narwhal")),
        "history_search_common_ms": timed(lambda: history(path, search="walrus", limit=100)),
        "history_all_ms": timed(lambda: history(path, limit=None), repeat=1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--responses", type=int, default=100_000)
    parser.add_argument("--generations", type=int, default=8)
    parser.add_argument("--keep", type=Path, default=None, help="leave the files here")
    args = parser.parse_args()
    random.seed(0)
    folder = args.keep or Path(tempfile.mkdtemp(prefix="nbr-store-bench-"))
    folder.mkdir(parents=True, exist_ok=True)

    cost = asyncio.run(write_cost(folder / "engine.sqlite3", args.generations))
    share = (cost["loop_us"] + cost["writer_us"]) / (1000 * cost["generation_ms"])
    print(f"write cost per response (real engine, {cost['tokens']} tokens, top-5 logprobs):")
    print(f"  generation {cost['generation_ms']:.0f} ms (median of {args.generations})")
    print(f"  event loop {cost['loop_us']:.0f} µs (the row as started)")
    print(
        f"  writer thread {cost['writer_us']:.0f} µs per response batched "
        f"(row built alone: {cost['build_us']:.0f} µs)"
    )
    loop_share = cost["loop_us"] / (1000 * cost["generation_ms"])
    print(f"  = {share:.2%} of the generation time (the event loop's part: {loop_share:.3%})")

    path = folder / "store.sqlite3"
    path.unlink(missing_ok=True)
    ids, seconds = fill(path, args.responses)
    size = path.stat().st_size + (
        Path(f"{path}-wal").stat().st_size if Path(f"{path}-wal").exists() else 0
    )
    print(
        f"\n{args.responses:,} responses written in {seconds:.1f} s "
        f"({1e6 * seconds / args.responses:.0f} µs each, batched), file {size / 2**20:.0f} MiB"
    )
    for name, value in asyncio.run(queries(path, ids)).items():
        print(f"  {name:22s} {value:8.2f} ms")


if __name__ == "__main__":
    main()
