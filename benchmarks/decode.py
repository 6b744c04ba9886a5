"""Decode speed and TTFT of the engine against its peers, measured side by side in one run.

Workloads (``--workloads``, benchmarks/workloads.py): ``chat`` (a short held-out question at
batch 1; 16 distinct questions of 36-226 tokens when concurrent) and ``grounded`` (summarise /
quote / correct / list a given text: prompts of 216-352 tokens whose answers repeat the input).
Scenarios (``--concurrency``, ``--stagger-ms``): 1 request; n concurrent cold prompts of mixed
lengths arriving together; and, for the largest n, the same prompts arriving one every
``--stagger-ms`` (default 50 ms).

Systems, each skipped when not installed or named in ``--skip``:
- ``engine``: ``TokenGenerator`` for every recipe in ``--recipes`` (default: the recipe ``auto``
  tries first on this CPU, ``recipes.AUTO_ORDER[0]``), all scenarios, in this process;
- ``llama.cpp``: ``llama-cpp-python`` on ``--gguf`` (default: the bundled model requantized to
  Q8_0 with llama.cpp's own quantizer), batch 1 only (it serves one sequence at a time, so its
  batch-1 speed is also what it serves concurrent requests at);
- ``vllm``: vLLM's CPU build from its own venv (``--vllm VENV/bin/python``, installed by
  benchmarks/install_vllm.sh), all scenarios: started as a server with both cores, driven over
  loopback ``/v1/completions`` with the same prompt tokens, paused (SIGSTOP) while the other
  systems are measured, stopped at the end;
- ``optimum`` (``ORTModelForCausalLM.generate`` on the Optimum recipe's file; fused recipes
  need inputs it does not give) and ``torch`` (PyTorch fp32 ``generate``): batch 1 only.

Every system generates exactly ``--max-tokens`` tokens greedily with eos ignored, from the same
token ids, cold (no prefix-cache hits: the engine's cache is off unless ``--warm``, vLLM runs
with prefix caching off, llama.cpp is reset). Rounds go round-robin over every (system,
workload, scenario) after one warm-up pass, and the table reports medians over rounds, because
timings on a shared machine drift: compare the ratios, which are measured side by side.

Columns: TTFT p50 / p95 over the requests of a round (from each request's own arrival); tok/s
is the decode speed after the first token at batch 1 and the aggregate (all tokens / wall time
from the first arrival to the last token) when concurrent; "vs own x1" divides by the same
system's batch-1 decode on the same workload; "vs llama.cpp" by llama.cpp's batch-1 decode; "vs
vLLM" by vLLM in the same scenario. The output check compares each peer's batch-1 tokens with
the engine's. ``--load`` times ``Engine.load()`` of the prepared model in fresh subprocesses,
``--prepare`` one prepare into an empty cache under ``/usr/bin/time -v`` (both slow, off by
default). Tables print as Markdown.

    python benchmarks/decode.py --rounds 3                          # everything installed
    python benchmarks/decode.py --vllm /work/venvs/vllm/bin/python  # with vLLM as a peer
    python benchmarks/decode.py --workloads chat --concurrency 1 --rounds 1 --skip optimum torch
    python benchmarks/decode.py --load --prepare --skip engine llama.cpp optimum torch
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from loadtime import measure_load, measure_prepare
from workloads import Workload, load_workloads

from nbresponses.models.cpu import physical_cores
from nbresponses.models.prepare import prepare_model
from nbresponses.models.recipes import AUTO_ORDER
from nbresponses.runtime.generator import DEFAULT_PREFIX_CACHE, TokenGenerator
from nbresponses.tokens.contract import SamplingParams

# One request's timeline: its arrival, (time, tokens) per chunk/step it received, its token ids.
Trace = tuple[float, list[tuple[float, int]], list[int]]
Metrics = dict[str, float]
SKIPPABLE = ("engine", "llama.cpp", "vllm", "optimum", "torch")


@dataclass(frozen=True)
class Scenario:
    n: int
    stagger_s: float = 0.0

    @property
    def label(self) -> str:
        if self.n == 1:
            return "x1"
        return f"x{self.n} staggered" if self.stagger_s else f"x{self.n}"


@dataclass
class Case:
    """One timed thing: a system on a workload in a scenario."""

    system: str
    workload: str
    scenario: Scenario
    run: Callable[[], list[Trace]]


def metrics(traces: list[Trace]) -> Metrics:
    """TTFT percentiles, batch-1 decode (the first request), aggregate and all-in tok/s."""
    ttfts = [events[0][0] - start for start, events, _ in traces]
    first_events = traces[0][1]
    first_tokens = sum(n for _, n in first_events)
    total = sum(n for _, events, _ in traces for _, n in events)
    begin = min(start for start, _, _ in traces)
    end = max(events[-1][0] for _, events, _ in traces)
    # steady state: every row has its first token, all decode together
    all_in = max(events[0][0] for _, events, _ in traces)
    steady = sum(n for _, events, _ in traces for t, n in events if t > all_in)
    decode_s = first_events[-1][0] - first_events[0][0]
    return {
        "ttft_p50": float(np.percentile(ttfts, 50)),
        "ttft_p95": float(np.percentile(ttfts, 95)),
        "decode_tps": (first_tokens - first_events[0][1]) / decode_s,
        "aggregate_tps": total / (end - begin),
        "steady_tps": steady / (end - all_in) if end > all_in else float("nan"),
    }


def engine_runner(
    engine: TokenGenerator, prompts: list[list[int]], max_tokens: int, stagger_s: float
) -> Callable[[], list[Trace]]:
    """One round: every prompt as a request, the i-th arriving after ``i * stagger_s``."""
    params = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True)

    async def one(i: int, prompt: list[int]) -> Trace:
        await asyncio.sleep(i * stagger_s)
        start = time.perf_counter()
        events: list[tuple[float, int]] = []
        ids: list[int] = []
        async for step in engine.generate(prompt, params):
            if step.token_ids:  # several per step once speculation lands
                events.append((time.perf_counter(), len(step.token_ids)))
                ids.extend(step.token_ids)
        return start, events, ids

    async def run() -> list[Trace]:
        return list(await asyncio.gather(*(one(i, p) for i, p in enumerate(prompts))))

    return lambda: asyncio.run(run())


def llama_cpp_runner(llm, prompt: list[int], max_tokens: int) -> Callable[[], list[Trace]]:
    def run() -> list[Trace]:
        llm.reset()  # else generate() reuses the previous run's KV for the shared prefix
        start = time.perf_counter()
        events: list[tuple[float, int]] = []
        ids: list[int] = []
        for token in llm.generate(prompt, temp=0.0, reset=True):  # never stops on eos
            events.append((time.perf_counter(), 1))
            ids.append(int(token))
            if len(ids) >= max_tokens:
                break
        return [(start, events, ids)]

    return run


def load_llama_cpp(gguf: Path):
    from llama_cpp import Llama

    return Llama(str(gguf), n_ctx=1024, n_threads=physical_cores(), n_batch=512, verbose=False)


def optimum_runner(prepared, threads: int | None):
    import onnxruntime as ort
    from optimum.onnxruntime import ORTModelForCausalLM

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads or physical_cores()
    return ORTModelForCausalLM.from_pretrained(
        str(prepared.path), file_name="model.onnx", use_cache=True, session_options=options
    )


def torch_model():
    import torch
    from transformers import AutoModelForCausalLM

    from nbresponses.models.sources import bundled_gguf_path

    gguf = bundled_gguf_path()
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name).eval()
    torch.set_num_threads(physical_cores())
    return model


def hf_runner(model, prompt: list[int], max_tokens: int) -> Callable[[], list[Trace]]:
    """``generate`` has no per-token clock: TTFT is a 1-token generate, decode the rest."""
    import torch

    ids = torch.tensor([prompt])
    mask = torch.ones_like(ids)

    def generate(n: int):
        with torch.no_grad():
            return model.generate(
                ids, attention_mask=mask, max_new_tokens=n, min_new_tokens=n, do_sample=False,
                pad_token_id=0,
            )  # fmt: skip

    def run() -> list[Trace]:
        start = time.perf_counter()
        generate(1)
        ttft = time.perf_counter() - start
        start = time.perf_counter()
        out = generate(max_tokens)
        end = time.perf_counter()
        tokens = [int(t) for t in out[0, ids.shape[1] :]]
        # as one first token at +ttft and the rest spread until the end of the full generate
        events = [(start + ttft, 1), (end, len(tokens) - 1)]
        return [(start, events, tokens)]

    return run


_QUIET_LLAMA_LOG = None


def bundled_q8_0_gguf(folder: Path) -> Path:
    """The bundled model as a llama.cpp Q8_0 GGUF, made once with llama.cpp's quantizer."""
    import ctypes

    import llama_cpp

    from nbresponses.models.sources import bundled_gguf_path

    target = folder / "smollm2-135m-instruct.Q8_0.gguf"
    if not target.is_file():
        folder.mkdir(parents=True, exist_ok=True)
        params = llama_cpp.llama_model_quantize_default_params()
        params.ftype = llama_cpp.LLAMA_FTYPE_MOSTLY_Q8_0
        params.allow_requantize = True
        scratch = target.with_suffix(".partial")
        global _QUIET_LLAMA_LOG  # the C callback must outlive this call: llama.cpp keeps it
        _QUIET_LLAMA_LOG = llama_cpp.llama_log_callback(lambda level, text, data: None)
        llama_cpp.llama_log_set(_QUIET_LLAMA_LOG, None)  # one line per tensor otherwise
        code = llama_cpp.llama_model_quantize(
            str(bundled_gguf_path()).encode(), str(scratch).encode(), ctypes.byref(params)
        )
        if code != 0:
            raise RuntimeError(f"llama_model_quantize failed with code {code}")
        scratch.rename(target)
    return target


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument(
        "--workloads", nargs="+", default=["chat", "grounded"], choices=["chat", "grounded"]
    )
    parser.add_argument("--concurrency", nargs="+", type=int, default=[1, 4, 16])
    parser.add_argument(
        "--stagger-ms",
        type=float,
        default=50.0,
        help="also run the largest concurrency with one arrival every this many ms (0: no)",
    )
    parser.add_argument(
        "--recipes", nargs="+", default=[AUTO_ORDER[0]], help="the first is the base"
    )
    parser.add_argument("--cache-dir", default=None)
    parser.add_argument(
        "--threads", type=int, default=None, help="engine threads (default: physical cores)"
    )
    parser.add_argument(
        "--gguf", type=Path, default=None, help="llama.cpp model (default: bundled, as Q8_0)"
    )
    parser.add_argument(
        "--vllm", type=Path, default=None, help="the python of a vLLM CPU venv: adds vLLM"
    )
    parser.add_argument(
        "--warm", action="store_true", help="keep the engine's prefix cache on (repeats hit it)"
    )
    parser.add_argument(
        "--speculation",
        choices=["on", "off"],
        default="on",
        help="the engine's exact self-speculation (on by default where the graph allows it)",
    )
    parser.add_argument("--skip", nargs="*", default=[], choices=SKIPPABLE)
    parser.add_argument(
        "--load", type=int, nargs="?", const=3, default=0, help="time Engine.load() N times (3)"
    )
    parser.add_argument(
        "--prepare", action="store_true", help="time a prepare into an empty cache (slow)"
    )
    return parser.parse_args()


def scenarios(args: argparse.Namespace) -> list[Scenario]:
    out = [Scenario(n) for n in sorted(set(args.concurrency))]
    top = max(args.concurrency)
    if args.stagger_ms > 0 and top > 1:
        out.append(Scenario(top, args.stagger_ms / 1000))
    return out


def main() -> None:
    args = parse_args()
    prepared = {
        r: prepare_model(None, r, cache_dir=args.cache_dir, progress=False) for r in args.recipes
    }
    base = args.recipes[0]
    # Cold prompts by default: every round repeats the prompts, and the prefix cache would turn
    # each prefill after the first into a one-token step, which is not what a new conversation
    # costs and not what the peers (reset, prefix caching off) are timed on.
    prefix_cache = DEFAULT_PREFIX_CACHE if args.warm else 0
    engines = {}
    if "engine" not in args.skip:
        engines = {
            r: TokenGenerator(p, threads=args.threads, prefix_cache_bytes=prefix_cache)
            for r, p in prepared.items()
        }
        if args.speculation == "off":
            for engine in engines.values():
                engine.speculation = False
    tokenizer = prepared[base].load_tokenizer()
    workloads = load_workloads(tokenizer, args.workloads)
    plan = scenarios(args)
    for p in prepared.values():
        print(p.describe())
    print(
        f"{args.max_tokens} tokens generated per request, greedy, eos ignored; "
        f"{args.threads or physical_cores()} engine threads; {args.rounds} rounds, medians; "
        f"engine prefix cache {'on (warm prompts)' if args.warm else 'off (cold prompts)'}"
    )
    for w in workloads:
        lengths = [len(p) for p in w.mixed]
        print(f"{w.name}: x1 prompt {len(w.single)} tokens, mixed {min(lengths)}-{max(lengths)}")

    cases = build_cases(args, engines, prepared[base], workloads, plan)
    server = None
    if args.vllm and "vllm" not in args.skip:
        from vllm_peer import VllmServer, vllm_model_folder, vllm_runner

        log = Path(args.cache_dir or "/tmp") / "vllm-serve.log"
        server = VllmServer(args.vllm, vllm_model_folder(args.cache_dir), log)
        print(f"starting vLLM (log: {log}) ...", flush=True)
        server.__enter__()
        print(f"vLLM answered after {server.startup_s:.0f} s")
        server.pause()  # resumed for its own cases only
        for w in workloads:
            for s in plan:
                run = vllm_runner(server, w.take(s.n), args.max_tokens, s.stagger_s)
                cases.append(Case("vLLM bf16", w.name, s, run))
    before = os.getloadavg()[0]
    try:
        samples = measure(cases, args.rounds)
    finally:
        if server is not None:
            server.__exit__()
        for engine in engines.values():
            engine.close_sync()
    if samples:
        report(samples, base, workloads, args.max_tokens)
        print(
            f"\nload average (1 min) {before:.1f} before the rounds, {os.getloadavg()[0]:.1f} "
            f"after, on {os.cpu_count()} CPUs: above ~2 other processes share the cores"
        )
    if args.load:
        load = measure_load(base, args.cache_dir, args.load)
        print(f"\n### Engine.load() of prepared `{base}`, fresh process, median of {args.load}\n")
        print("| import nbresponses | Engine.load() | first token after load | whole process |")
        print("|---|---|---|---|")
        print(
            f"| {load['import_s']:.2f} s | {load['load_s']:.2f} s | "
            f"{load['first_token_s'] * 1000:.0f} ms | {load['process_s']:.2f} s |"
        )
    if args.prepare:
        prep = measure_prepare(base)
        print(f"\n### prepare `{base}` of the bundled model into an empty cache (/usr/bin/time)\n")
        print("| wall time | peak RSS |\n|---|---|")
        print(f"| {prep['wall_s']:.1f} s | {prep['peak_rss_mb']:.0f} MB |")


def build_cases(args, engines, base_prepared, workloads: list[Workload], plan: list[Scenario]):
    cases: list[Case] = []
    for recipe, engine in engines.items():
        for w in workloads:
            for s in plan:
                run = engine_runner(engine, w.take(s.n), args.max_tokens, s.stagger_s)
                cases.append(Case(f"engine {recipe}", w.name, s, run))
    one = Scenario(1)
    if "llama.cpp" not in args.skip:
        try:
            gguf = args.gguf or bundled_q8_0_gguf(base_prepared.path.parent.parent / "llama.cpp")
            llm = load_llama_cpp(gguf)
            for w in workloads:
                run = llama_cpp_runner(llm, w.single, args.max_tokens)
                cases.append(Case("llama.cpp Q8_0", w.name, one, run))
        except ImportError:
            print("llama-cpp-python is not installed: llama.cpp skipped")
    if "optimum" not in args.skip and base_prepared.recipe.startswith("fused"):
        print(f"optimum generate skipped: {base_prepared.recipe} needs inputs it does not give")
    elif "optimum" not in args.skip:
        model = optimum_runner(base_prepared, args.threads)
        for w in workloads:
            run = hf_runner(model, w.single, args.max_tokens)
            cases.append(Case(f"optimum generate {base_prepared.recipe}", w.name, one, run))
    if "torch" not in args.skip:
        model = torch_model()
        for w in workloads:
            cases.append(
                Case("pytorch fp32", w.name, one, hf_runner(model, w.single, args.max_tokens))
            )
    return cases


@dataclass
class Sampled:
    case: Case
    metrics: Metrics  # medians over rounds
    tokens: list[int]  # the first request's output in the warm-up pass


def measure(cases: list[Case], rounds: int) -> list[Sampled]:
    warm = [case.run() for case in cases]  # warm-up: graph caches, compiled kernels, threads
    rows: list[list[Metrics]] = [[] for _ in cases]
    for r in range(rounds):
        for i, case in enumerate(cases):
            rows[i].append(metrics(case.run()))
        print(f"round {r + 1}/{rounds} done", flush=True)
    return [
        Sampled(case, {k: float(np.median([m[k] for m in ms])) for k in ms[0]}, traces[0][2])
        for case, ms, traces in zip(cases, rows, warm, strict=True)
    ]


def _speed(s: Sampled) -> float:
    return s.metrics["decode_tps"] if s.case.scenario.n == 1 else s.metrics["aggregate_tps"]


def _ratio(x: float, y: float | None) -> str:
    return f"{x / y:.2f}x" if y else "–"


def report(samples: list[Sampled], base: str, workloads: list[Workload], max_tokens: int) -> None:
    by = {(s.case.system, s.case.workload, s.case.scenario.label): s for s in samples}
    systems = list(dict.fromkeys(s.case.system for s in samples))
    llama = next((n for n in systems if n.startswith("llama.cpp")), None)
    vllm = next((n for n in systems if n.startswith("vLLM")), None)
    header = (
        "| workload | scenario | system | TTFT p50 | TTFT p95 | TTFT p50 vs own x1 | tok/s "
        "| vs own x1 | vs llama.cpp | vs vLLM |"
    )
    print(f"\n### decode, {max_tokens} greedy tokens per request (medians)\n")
    print(header)
    print("|" + "---|" * (header.count("|") - 1))
    for s in samples:
        w, label, system = s.case.workload, s.case.scenario.label, s.case.system
        own = by.get((system, w, "x1"))
        ll = by.get((llama, w, "x1")) if llama else None
        vl = by.get((vllm, w, label)) if vllm else None
        speed = _speed(s)
        print(
            f"| {w} | {label} | {system} | {s.metrics['ttft_p50'] * 1000:.0f} ms "
            f"| {s.metrics['ttft_p95'] * 1000:.0f} ms "
            f"| {_ratio(s.metrics['ttft_p50'], own.metrics['ttft_p50'] if own else None)} "
            f"| {speed:.1f} | {_ratio(speed, own.metrics['decode_tps'] if own else None)} "
            f"| {_ratio(speed, ll.metrics['decode_tps'] if ll else None)} "
            f"| {_ratio(speed, _speed(vl) if vl else None)} |"
        )
    print(
        "\ntok/s: decode after the first token for x1, aggregate (all tokens / wall time from "
        "the first arrival) for concurrent runs; vs llama.cpp divides by its batch-1 decode "
        "(it serves one sequence at a time); vs vLLM by vLLM in the same scenario."
    )
    engine = f"engine {base}"
    if (engine, workloads[0].name, "x1") in by and len(systems) > 1:
        print(f"\n### same output as {engine} (batch 1, greedy)\n")
        print("| workload | system | identical tokens | first difference at |\n|---|---|---|---|")
    for w in workloads:
        ref = by.get((engine, w.name, "x1"))
        for system in systems:
            other = by.get((system, w.name, "x1"))
            if ref is None or other is None or system == engine:
                continue
            a, b = ref.tokens, other.tokens
            first = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), None)
            same = sum(x == y for x, y in zip(a, b, strict=False))
            if first is None and len(a) != len(b):
                first = min(len(a), len(b))
            where = "–" if first is None else f"token {first}"
            print(f"| {w.name} | {system} | {same}/{max(len(a), len(b))} | {where} |")
    for s in samples:
        if s.case.system.startswith("engine") and s.case.scenario.n > 1:
            # like for like with x1's decode speed, which is also measured after first tokens
            own = by.get((s.case.system, s.case.workload, "x1"))
            ratio = _ratio(s.metrics["steady_tps"], own.metrics["decode_tps"] if own else None)
            print(
                f"{s.case.system} {s.case.workload} {s.case.scenario.label}: once all are "
                f"decoding {s.metrics['steady_tps']:.0f} tok/s ({ratio} own x1)"
            )


if __name__ == "__main__":
    main()
