"""Load and prepare costs for benchmarks/decode.py (``--load``, ``--prepare``).

Both run in fresh subprocesses, because what a notebook pays is a cold interpreter's: imports,
resolving the bundled source, reading the tokenizer and chat template, creating the ONNX Runtime
session. ``Engine.load()`` is timed on an already prepared model (the cache given), median of a
few runs; a prepare is timed into an empty cache dir under ``/usr/bin/time -v`` for its wall time
and peak resident memory (children included: ``time`` reports the largest process).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

LOAD_SCRIPT = """
import asyncio, json, sys, time
t0 = time.perf_counter()
import nbresponses as nbr
from nbresponses.tokens.contract import SamplingParams
t1 = time.perf_counter()
engine = asyncio.run(nbr.Engine.load(
    quantization=sys.argv[1], cache_dir=sys.argv[2] or None, progress=False, store_path=sys.argv[3]
))
t2 = time.perf_counter()

async def first_token():
    prompt = engine.tokenizer.apply_chat_template(
        [{"role": "user", "content": "Hi!"}], add_generation_prompt=True
    )
    async for _ in engine.generator.generate(prompt, SamplingParams(max_tokens=1, temperature=0)):
        pass

asyncio.run(first_token())
t3 = time.perf_counter()
engine.generator.close_sync()  # stop the scheduler thread before the interpreter tears down
print(json.dumps({"import_s": t1 - t0, "load_s": t2 - t1, "first_token_s": t3 - t2}))
"""

PREPARE_SCRIPT = """
import sys
from nbresponses.models.prepare import prepare_model
prepare_model(None, sys.argv[1], cache_dir=sys.argv[2], progress=False)
"""


def _env() -> dict[str, str]:
    return {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


def measure_load(recipe: str, cache_dir: str | None, runs: int) -> dict[str, float]:
    """Median seconds of ``import nbresponses``, ``Engine.load()``, the first token after it,
    and the whole fresh process (interpreter start included), over ``runs`` subprocesses."""
    samples: list[dict[str, float]] = []
    for _ in range(runs):
        with tempfile.TemporaryDirectory() as tmp:
            store = str(Path(tmp) / "responses.sqlite3")  # a new store file, not the user's
            start = time.perf_counter()
            out = subprocess.run(
                [sys.executable, "-c", LOAD_SCRIPT, recipe, cache_dir or "", store],
                capture_output=True, text=True, env=_env(),
            )  # fmt: skip
            if out.returncode != 0:
                raise RuntimeError(
                    f"Engine.load() run failed ({out.returncode}):\n{out.stderr[-3000:]}"
                )
            sample = json.loads(out.stdout.strip().splitlines()[-1])
            sample["process_s"] = time.perf_counter() - start
            samples.append(sample)
    return {k: statistics.median(s[k] for s in samples) for k in samples[0]}


def measure_prepare(recipe: str) -> dict[str, float]:
    """Wall seconds and peak RSS (MB) of one prepare of the bundled model into an empty cache."""
    tmp = Path(tempfile.mkdtemp(prefix="nbr-prepare-"))
    try:
        out = subprocess.run(
            ["/usr/bin/time", "-v", sys.executable, "-c", PREPARE_SCRIPT, recipe, str(tmp)],
            capture_output=True, text=True, env=_env(),
        )  # fmt: skip
        if out.returncode != 0:
            raise RuntimeError(f"prepare failed:\n{out.stderr[-3000:]}")
        wall = re.search(r"Elapsed \(wall clock\) time \(h:mm:ss or m:ss\): (\S+)", out.stderr)
        rss = re.search(r"Maximum resident set size \(kbytes\): (\d+)", out.stderr)
        if wall is None or rss is None:
            raise RuntimeError(f"unexpected /usr/bin/time output:\n{out.stderr[-2000:]}")
        seconds = sum(
            float(part) * 60**i for i, part in enumerate(reversed(wall.group(1).split(":")))
        )
        return {"wall_s": seconds, "peak_rss_mb": int(rss.group(1)) / 1024}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
