"""Where a decode step's milliseconds go, end to end: the graph run, sampling, logprobs, the
scheduler's Python, the hand-off to the event loop; and inside the graph run, ONNX Runtime's own
per-operator totals against the run's wall time (the rest is dispatch between kernels).

Two parts, both on the prepared model of ``--recipe`` (default: the recipe ``auto`` tries first
on this CPU):

1. the engine (``TokenGenerator``), chat prompts (benchmarks/workloads.py), every request
   ``--max-tokens`` greedy tokens with eos ignored, at batch 1 and at batch 16, each once plain
   and once with ``top_logprobs=20`` and details (rank, entropy). The scheduler's methods and the
   sampling functions are wrapped with ``time.perf_counter`` (the wrappers cost ~1 us each);
   only steps with every row decoding count (not those that admit). The event loop's side of the
   hand-off (``_Mailbox._drain``) runs on the main thread and is timed there.
2. ONNX Runtime's profiler (``enable_profiling``) on the same graph, ``--steps`` decode steps
   at batch 1 and 16 with ``--keys`` columns of KV: node count per step, the sum of kernel times
   by operator type, and the run's wall time.

    python benchmarks/step_profile.py [--max-tokens 64] [--steps 50] [--cprofile]
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import json
import os
import pstats
import statistics
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import onnxruntime as ort
from workloads import load_workloads

from nbresponses.models import kernels
from nbresponses.models.prepare import prepare_model
from nbresponses.models.recipes import AUTO_ORDER
from nbresponses.runtime import generator as generator_module
from nbresponses.runtime import sampling
from nbresponses.runtime.generator import TokenGenerator
from nbresponses.runtime.kv import EndPaddedKV
from nbresponses.runtime.runner import OnnxRunner, session_options
from nbresponses.tokens.contract import SamplingParams


class Clock:
    """Seconds spent in each wrapped call, per label, on the calls made while ``on`` (a call
    inside another of the same label counts once: ``token_logprobs`` calls ``token_logprob``
    where no compiled core is loaded)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)
        self.on = False
        self._inside: set[str] = set()

    def wrap(self, label: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            if not self.on or label in self._inside:
                return fn(*args, **kwargs)
            start, cpu = time.perf_counter(), time.thread_time()
            self._inside.add(label)
            try:
                return fn(*args, **kwargs)
            finally:
                self._inside.discard(label)
                self.seconds[label] += time.perf_counter() - start
                self.seconds[label + " cpu"] += time.thread_time() - cpu
                self.calls[label] += 1

        return timed


def engine_profile(
    engine: TokenGenerator,
    prompts: list[list[int]],
    params: SamplingParams,
    profiler: cProfile.Profile | None,
) -> dict[str, float]:
    """Milliseconds per decode step in each part, for one batch of ``prompts``."""
    scheduler = engine._scheduler
    clock = Clock()
    originals = {
        "_emit": scheduler._emit,
        "_drafts": scheduler._drafts,
        "_send": scheduler._send,
        "_decode": scheduler._decode,
    }
    patched_sampling = {
        name: getattr(sampling, name)
        for name in ("choose", "token_logprob", "token_logprobs", "processed_logprob", "biased")
        if hasattr(sampling, name)
    }
    decoding = {"steps": 0, "wall": 0.0}
    rows_total = [0]

    def decode() -> None:
        full = len(scheduler.rows) == len(prompts) and not scheduler.waiting
        clock.on = full
        if full and profiler is not None:
            profiler.enable()
        start, cpu = time.perf_counter(), time.thread_time()
        try:
            originals["_decode"]()
        finally:
            if full:
                decoding["wall"] += time.perf_counter() - start
                clock.seconds["step cpu"] += time.thread_time() - cpu
                decoding["steps"] += 1
                rows_total[0] += len(prompts)
                if profiler is not None:
                    profiler.disable()
            clock.on = False

    run_in_place = scheduler.runner._run_in_place  # one-token and drafted steps alike
    scheduler.runner._run_in_place = clock.wrap("graph run", run_in_place)  # type: ignore[method-assign]
    scheduler._drafts = clock.wrap("drafts", originals["_drafts"])  # type: ignore[method-assign]
    make = getattr(scheduler.kv, "_make", None)  # in-place KV: new buffers when room runs out
    if make is not None:
        scheduler.kv._make = clock.wrap("kv make", make)  # type: ignore[union-attr]
    scheduler._emit = clock.wrap("_emit", originals["_emit"])  # type: ignore[method-assign]
    scheduler._send = clock.wrap("hand-off (post)", originals["_send"])  # type: ignore[method-assign]
    scheduler._decode = decode  # type: ignore[method-assign]
    for name, fn in patched_sampling.items():  # a step's rows at once count as logprobs too
        label = "token_logprob" if name == "token_logprobs" else name
        setattr(sampling, name, clock.wrap(label, fn))
    drain = generator_module._Mailbox._drain
    loop_side = {"s": 0.0, "calls": 0}

    def timed_drain(self: Any) -> None:
        start = time.perf_counter()
        drain(self)
        loop_side["s"] += time.perf_counter() - start
        loop_side["calls"] += 1

    generator_module._Mailbox._drain = timed_drain  # type: ignore[method-assign]

    async def one(prompt: list[int]) -> None:
        async for _ in engine.generate(prompt, params):
            pass

    async def run() -> None:
        await asyncio.gather(*(one(p) for p in prompts))

    try:
        asyncio.run(run())
        scheduler.wait_idle(60)  # the last step's rows get their steps before it returns
    finally:
        for name, fn in originals.items():
            setattr(scheduler, name, fn)
        scheduler.runner._run_in_place = run_in_place  # type: ignore[method-assign]
        if make is not None:
            scheduler.kv._make = make  # type: ignore[union-attr]
        for name, fn in patched_sampling.items():
            setattr(sampling, name, fn)
        generator_module._Mailbox._drain = drain  # type: ignore[method-assign]
    steps = max(decoding["steps"], 1)
    ms = {k: v * 1000 / steps for k, v in clock.seconds.items()}
    ms["step (wall, _decode)"] = decoding["wall"] * 1000 / steps
    ms["steps"] = decoding["steps"]
    ms["tokens per step"] = clock.calls["_emit"] / steps
    ms["graph runs per step"] = clock.calls["graph run"] / steps
    ms["loop drain (main thread, all steps)"] = loop_side["s"] * 1000 / steps
    return ms


def print_engine_table(results: dict[str, dict[str, float]]) -> None:
    """Each cell: wall milliseconds per step, and in brackets the engine thread's CPU
    milliseconds (``time.thread_time``: what the step's Python costs even on a busy machine;
    for the graph run only the calling thread's share of ONNX Runtime's work)."""
    labels = list(results)
    print("| ms per decode step: wall (engine thread CPU) | " + " | ".join(labels) + " |")
    print("|---|" + "---|" * len(labels))

    def get(r: dict[str, float], *keys: str, cpu: bool = False) -> float:
        return sum(r.get(k + " cpu" if cpu else k, 0.0) for k in keys)

    def row(name: str, *keys: str) -> None:
        cells = [
            f"{get(results[k], *keys):.3f} ({get(results[k], *keys, cpu=True):.3f})" for k in labels
        ]
        print(f"| {name} | " + " | ".join(cells) + " |")

    print("| steps timed | " + " | ".join(f"{results[k]['steps']:.0f}" for k in labels) + " |")
    print(
        "| tokens per step (rows x kept drafts) | "
        + " | ".join(f"{results[k]['tokens per step']:.2f}" for k in labels)
        + " |"
    )
    parts = {
        "graph run (`runner._run_in_place`)": ("graph run",),
        "speculation's drafts (`_drafts`)": ("drafts",),
        "sampling (choose, logit_bias)": ("choose", "biased"),
        "logprobs (`token_logprob`, processed)": ("token_logprob", "processed_logprob"),
        "hand-off, worker side (`_send`)": ("hand-off (post)",),
        "KV buffers re-made (`kv._make`, when room runs out)": ("kv make",),
    }
    for name, keys in parts.items():
        row(name, *keys)
    everything = [key for keys in parts.values() for key in keys]
    cells = []
    for k in labels:
        r = results[k]
        wall = r["step (wall, _decode)"] - get(r, *everything)
        cpu = r.get("step cpu", 0.0) - get(r, *everything, cpu=True)
        cells.append(f"{wall:.3f} ({cpu:.3f})")
    print(
        "| other Python of the step (`_decode`, `_emit`, `kv.step`) | " + " | ".join(cells) + " |"
    )
    cells = [
        f"{results[k]['step (wall, _decode)']:.3f} ({results[k].get('step cpu', 0.0):.3f})"
        for k in labels
    ]
    print("| **whole step (`_decode`)** | " + " | ".join(cells) + " |")
    print(
        "| hand-off, loop side (`_drain`, main thread, wall) | "
        + " | ".join(f"{results[k]['loop drain (main thread, all steps)']:.3f}" for k in labels)
        + " |"
    )


def ort_profile(runner_path: Path, threads: int | None, batch: int, keys: int, steps: int):
    """(nodes per step, {op type: ms per step}, wall ms per step) from ONNX Runtime's profiler."""
    runner = OnnxRunner(runner_path, threads=threads)
    with tempfile.TemporaryDirectory() as folder:
        options = kernels.for_model(session_options(threads), runner_path)  # our operators
        options.enable_profiling = True
        options.profile_file_prefix = os.path.join(folder, "ort")
        runner.session = ort.InferenceSession(
            str(runner_path), options, providers=["CPUExecutionProvider"]
        )
        layout = runner.layout
        kv = EndPaddedKV(layout, reads_every_column=runner.reads_every_column)
        kv.add_rows([layout.zeros(keys)] * batch)
        for _ in range(3):  # warm-up, then cut from the profile below
            kv.step(runner, [5] * batch)
            for i in range(batch):
                kv.truncate(i, keys)
        walls = []
        for _ in range(steps):
            start = time.perf_counter()
            kv.step(runner, [5] * batch)
            walls.append(time.perf_counter() - start)
            for i in range(batch):
                kv.truncate(i, keys)
        trace = Path(runner.session.end_profiling())
        events = json.loads(trace.read_text())
    runs = [e for e in events if e.get("cat") == "Session" and e.get("name") == "model_run"]
    runs = runs[-steps:]
    first = runs[0]["ts"]
    per_op: dict[str, float] = defaultdict(float)
    nodes = 0
    for e in events:
        if e.get("cat") != "Node" or not e.get("name", "").endswith("_kernel_time"):
            continue
        if e["ts"] < first:
            continue
        per_op[e["args"].get("op_name", "?")] += e["dur"] / 1000 / steps
        nodes += 1
    run_ms = statistics.median(r["dur"] for r in runs) / 1000
    return nodes / steps, dict(per_op), run_ms, statistics.median(walls) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--recipe", default=AUTO_ORDER[0])
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--steps", type=int, default=50, help="ORT-profiled steps per batch size")
    parser.add_argument("--keys", type=int, default=100)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--batches", nargs="+", type=int, default=[1, 16])
    parser.add_argument("--skip-ort", action="store_true")
    parser.add_argument("--cprofile", action="store_true", help="cProfile the timed steps")
    parser.add_argument("--sort", default="tottime", help="cProfile's order (tottime, cumtime)")
    parser.add_argument("--top", type=int, default=15, help="cProfile's rows")
    args = parser.parse_args()
    prepared = prepare_model(None, args.recipe, progress=False)
    engine = TokenGenerator(prepared, threads=args.threads, prefix_cache_bytes=0)
    workload = load_workloads(engine.tokenizer, ["chat"])[0]
    print(f"{prepared.name} [{args.recipe}], chat prompts, {args.max_tokens} tokens per request")
    print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs\n")
    plain = SamplingParams(max_tokens=args.max_tokens, temperature=0, ignore_eos=True)
    top = SamplingParams(
        max_tokens=args.max_tokens, temperature=0, ignore_eos=True, top_logprobs=20, details=True
    )
    results: dict[str, dict[str, float]] = {}
    profiles: dict[str, cProfile.Profile] = {}
    engine_profile(engine, workload.take(1), plain, None)  # warm-up
    for batch in args.batches:
        for label, params in (("greedy", plain), ("top-20 + details", top)):
            name = f"x{batch} {label}"
            profiler = cProfile.Profile(time.thread_time) if args.cprofile else None
            results[name] = engine_profile(engine, workload.take(batch), params, profiler)
            if profiler is not None:
                profiles[name] = profiler
    engine.close_sync()
    print_engine_table(results)
    for name, profiler in profiles.items():
        print(
            f"\n#### cProfile of the timed steps, {name} ({args.sort}, top {args.top}, "
            "thread CPU time)\n```"
        )
        pstats.Stats(profiler).sort_stats(args.sort).print_stats(args.top)
        print("```")
    if args.skip_ort:
        return
    for batch in args.batches:
        nodes, per_op, run_ms, wall_ms = ort_profile(
            prepared.onnx_path, args.threads, batch, args.keys, args.steps
        )
        kernels = sum(per_op.values())
        print(
            f"\n### ONNX Runtime profile, batch {batch}, {args.keys} keys, {args.steps} steps: "
            f"{nodes:.0f} nodes a step; model_run {run_ms:.3f} ms (median), kv.step wall "
            f"{wall_ms:.3f} ms; kernels sum {kernels:.3f} ms, so {run_ms - kernels:.3f} ms "
            f"({100 * (run_ms - kernels) / run_ms:.0f}%) between kernels (dispatch)\n"
        )
        print("| op type | ms per step | share of model_run |\n|---|---|---|")
        for op, ms in sorted(per_op.items(), key=lambda kv: -kv[1]):
            print(f"| {op} | {ms:.3f} | {100 * ms / run_ms:.1f}% |")


if __name__ == "__main__":
    main()
