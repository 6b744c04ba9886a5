"""Decode speed of the engine against its peers, measured side by side in one process.

Systems (each optional ones skipped when not installed): the engine at 1, 4 and 16 concurrent
requests for every recipe in ``--recipes`` (default: ``q8``, the Optimum graph, and ``fused-q8``,
our fused graph); optimum ``ORTModelForCausalLM.generate`` on the first recipe's model file;
PyTorch fp32 ``generate``; llama.cpp (``llama-cpp-python``) on a GGUF given with ``--gguf`` (Q8_0
of the same model for a fair comparison). Rounds go round-robin over the systems and the table
reports medians, because timings on shared machines drift. Every system generates exactly
``--max-tokens`` tokens greedily (eos ignored) from the same chat prompt, cold: the engine's
prefix cache is off unless ``--warm``.

When llama-cpp-python is installed and no ``--gguf`` is given, the bundled GGUF (Q4_1) is
converted to Q8_0 with llama.cpp's own quantizer (``llama_model_quantize``, requantizing: the
weights carry Q4_1's precision, the tensors and kernels are Q8_0's, so speed is Q8_0's). Without
llama-cpp-python the llama.cpp column is the ANCHOR from docs/concepts/measurements.md (Q8_0,
batch 1, 127 tok/s on a quiet machine with this model and prompt), not a measurement of this
run: on a busy machine every measured number drops and the ratio against the anchor
understates.

    pip install llama-cpp-python   # builds llama.cpp from source (about 7 min on 2 cores)
    python benchmarks/decode.py --rounds 3
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from nbresponses.models.cpu import physical_cores
from nbresponses.models.prepare import prepare_model
from nbresponses.runtime.generator import DEFAULT_PREFIX_CACHE, TokenGenerator
from nbresponses.tokens.contract import GenerationStats, SamplingParams

PROMPT = "What is the capital of France? Answer in a few sentences."
# "x16 mixed": 16 prompts of 30 to ~200 tokens, so decoding rows have different lengths (the
# batch is ragged), as in real use; the plain x4/x16 rows all share one prompt.
MIXED_CONTEXT = (
    "The Seine flows through Paris. The city has twenty arrondissements. Its metro opened in "
    "1900. The Louvre was a royal palace before it became a museum. "
)

Result = dict[str, float]  # ttft_s, decode_tps (batch 1), aggregate_tps
LLAMA_CPP_Q8_ANCHOR = 127.0  # tok/s, batch 1, docs/concepts/measurements.md (not measured here)
CONCURRENCY = (1, 4, 16)


def mixed_prompts(tokenizer, n: int = 16) -> list[list[int]]:
    """``n`` chat prompts of growing length: the question after 0..n-1 sentences of context."""
    sentences = MIXED_CONTEXT.split(". ")
    texts = [" ".join(sentences[: i % len(sentences)] * (1 + i // 4)) + PROMPT for i in range(n)]
    return [
        list(
            tokenizer.apply_chat_template(
                [{"role": "user", "content": t}], add_generation_prompt=True
            )
        )
        for t in texts
    ]


def engine_runner(engine: TokenGenerator, prompts: list[list[int]], max_tokens: int):
    """One round: every prompt as a concurrent request."""
    engine._scheduler.stop_ids = frozenset()  # benchmark only: fixed lengths, eos ignored

    async def one(prompt: list[int]) -> tuple[float, list[float], int]:
        stats = GenerationStats()
        start = time.perf_counter()
        times = []
        async for _ in engine.generate(
            prompt, SamplingParams(max_tokens=max_tokens, temperature=0), stats
        ):
            times.append(time.perf_counter())
        return start, times, stats.output_tokens

    async def run() -> Result:
        start = time.perf_counter()
        results = await asyncio.gather(*(one(p) for p in prompts))
        end = time.perf_counter()
        total = sum(r[2] for r in results)
        _, first_times, first_tokens = results[0]
        # steady state: every row admitted (the last prompt prefilled), all decoding together
        all_in = max(times[0] for _, times, _ in results)
        steady = sum(t > all_in for _, times, _ in results for t in times)
        return {
            "ttft_s": statistics.median(times[0] - begin for begin, times, _ in results),
            "decode_tps": (first_tokens - 1) / (first_times[-1] - first_times[0]),
            "aggregate_tps": total / (end - start),
            "steady_tps": steady / (end - all_in),
        }

    return lambda: asyncio.run(run())


def optimum_runner(
    prepared, prompt: list[int], max_tokens: int, threads: int | None = None
) -> Callable[[], Result]:
    import onnxruntime as ort
    import torch
    from optimum.onnxruntime import ORTModelForCausalLM

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads or physical_cores()
    model = ORTModelForCausalLM.from_pretrained(
        str(prepared.path), file_name="model.onnx", use_cache=True, session_options=options
    )
    ids = torch.tensor([prompt])
    return lambda: _hf_generate(model, ids, max_tokens)


def torch_runner(prompt: list[int], max_tokens: int) -> Callable[[], Result]:
    import torch
    from transformers import AutoModelForCausalLM

    from nbresponses.models.sources import bundled_gguf_path

    gguf = bundled_gguf_path()
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name).eval()
    torch.set_num_threads(physical_cores())
    ids = torch.tensor([prompt])
    return lambda: _hf_generate(model, ids, max_tokens)


def _hf_generate(model, ids, max_tokens: int) -> Result:
    import torch

    mask = torch.ones_like(ids)
    with torch.no_grad():
        start = time.perf_counter()
        model.generate(
            ids,
            attention_mask=mask,
            max_new_tokens=1,
            min_new_tokens=1,
            do_sample=False,
            pad_token_id=0,
        )
        ttft = time.perf_counter() - start
        start = time.perf_counter()
        out = model.generate(
            ids,
            attention_mask=mask,
            max_new_tokens=max_tokens,
            min_new_tokens=max_tokens,
            do_sample=False,
            pad_token_id=0,
        )
        elapsed = time.perf_counter() - start
    n = out.shape[1] - ids.shape[1]
    return {"ttft_s": ttft, "decode_tps": (n - 1) / (elapsed - ttft), "aggregate_tps": n / elapsed}


def llama_cpp_runner(gguf: Path, prompt: list[int], max_tokens: int) -> Callable[[], Result]:
    from llama_cpp import Llama

    llm = Llama(str(gguf), n_ctx=1024, n_threads=physical_cores(), n_batch=512, verbose=False)

    def run() -> Result:
        llm.reset()
        start = time.perf_counter()
        first = None
        n = 0
        for _ in llm.generate(prompt, temp=0.0, reset=True):
            n += 1
            if first is None:
                first = time.perf_counter()
            if n >= max_tokens:
                break
        end = time.perf_counter()
        return {
            "ttft_s": first - start,
            "decode_tps": (n - 1) / (end - first),
            "aggregate_tps": n / (end - start),
        }

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument(
        "--recipes", nargs="+", default=["q8", "fused-q8"], help="the first is the baseline"
    )
    parser.add_argument("--cache-dir", default=None)
    parser.add_argument(
        "--threads", type=int, default=None, help="engine threads (default: physical cores)"
    )
    parser.add_argument(
        "--gguf", type=Path, default=None, help="llama.cpp model (default: bundled, as Q8_0)"
    )
    parser.add_argument(
        "--warm", action="store_true", help="keep the prefix cache on (repeat prompts hit it)"
    )
    parser.add_argument("--skip", nargs="*", default=[], help="optimum torch llama.cpp")
    args = parser.parse_args()

    prepared = {
        r: prepare_model(None, r, cache_dir=args.cache_dir, progress=False) for r in args.recipes
    }
    # Cold prompts by default: every round repeats the prompt, and the prefix cache would turn
    # each prefill after the first into a one-token step (TTFT 16 ms instead of ~50), which is
    # not what a new conversation costs and not what llama.cpp (reset each run) is timed on.
    prefix_cache = DEFAULT_PREFIX_CACHE if args.warm else 0
    engines = {
        r: TokenGenerator(p, threads=args.threads, prefix_cache_bytes=prefix_cache)
        for r, p in prepared.items()
    }
    base = args.recipes[0]
    prompt = list(
        engines[base].tokenizer.apply_chat_template(
            [{"role": "user", "content": PROMPT}], add_generation_prompt=True
        )
    )
    for p in prepared.values():
        print(p.describe())
    print(
        f"prompt {len(prompt)} tokens, {args.max_tokens} generated, "
        f"{args.threads or physical_cores()} engine threads, {args.rounds} rounds, "
        f"prefix cache {'on (warm prompts)' if args.warm else 'off (cold prompts)'}"
    )

    systems: dict[str, Callable[[], Result]] = {}
    mixed = mixed_prompts(engines[base].tokenizer)
    print(f"x16 mixed: prompts of {min(map(len, mixed))}-{max(map(len, mixed))} tokens")
    for recipe, engine in engines.items():
        for n in CONCURRENCY:
            systems[f"engine {recipe} x{n}"] = engine_runner(engine, [prompt] * n, args.max_tokens)
        systems[f"engine {recipe} x16 mixed"] = engine_runner(engine, mixed, args.max_tokens)
    if "optimum" not in args.skip:
        systems[f"optimum generate {base}"] = optimum_runner(
            prepared[base], prompt, args.max_tokens, args.threads
        )
    if "torch" not in args.skip:
        systems["pytorch fp32 generate"] = torch_runner(prompt, args.max_tokens)
    if "llama.cpp" not in args.skip:
        try:
            gguf = args.gguf or bundled_q8_0_gguf(prepared[base].path.parent.parent / "llama.cpp")
            systems[f"llama.cpp {gguf.name}"] = llama_cpp_runner(gguf, prompt, args.max_tokens)
        except ImportError:
            print("llama-cpp-python is not installed: llama.cpp skipped (anchor used)")

    for run in systems.values():  # warm-up
        run()
    samples: dict[str, list[Result]] = {name: [] for name in systems}
    for _ in range(args.rounds):
        for name, run in systems.items():
            samples[name].append(run())
    med = {
        name: {k: float(np.median([r[k] for r in rs])) for k in rs[0]}
        for name, rs in samples.items()
    }
    _report(med, engines, base)
    for engine in engines.values():
        engine.close_sync()


def _speed(name: str, m: Result) -> float:
    """Batch-1 decode speed, or the aggregate for concurrent runs."""
    concurrent = name.endswith(tuple(f"x{n}" for n in CONCURRENCY[1:])) or name.endswith("mixed")
    return m["aggregate_tps"] if concurrent else m["decode_tps"]


def _report(med: dict[str, Result], engines: dict, base: str) -> None:
    optimum = next((n for n in med if n.startswith("optimum")), None)
    llama = next((n for n in med if n.startswith("llama.cpp")), None)
    llama_tps = med[llama]["decode_tps"] if llama else LLAMA_CPP_Q8_ANCHOR
    llama_label = "vs llama.cpp" if llama else "vs llama*"
    header = f"{'system':30} {'TTFT ms':>8} {'tok/s':>8}  {'vs ' + base + ' x1':>10}"
    header += f"  {'vs ' + base + ' same n':>14}"
    header += f"  {'vs optimum':>10}" if optimum else ""
    header += f"  {llama_label:>12}"
    print(header)
    for name, m in med.items():
        speed = _speed(name, m)
        same = name.replace(name.split()[1], base, 1) if name.startswith("engine") else None
        line = f"{name:30} {m['ttft_s'] * 1000:8.0f} {speed:8.1f}"
        line += f"  {speed / med[f'engine {base} x1']['decode_tps']:9.2f}x"
        line += f"  {speed / _speed(same, med[same]):13.2f}x" if same in med else f"  {'':>14}"
        line += f"  {speed / med[optimum]['decode_tps']:9.2f}x" if optimum else ""
        line += f"  {speed / llama_tps:11.2f}x"
        print(line)
    print("tok/s: batch-1 decode for x1 and single systems, aggregate for x4/x16/x16 mixed")
    if not llama:
        print(
            f"* llama.cpp Q8_0 = {LLAMA_CPP_Q8_ANCHOR:.0f} tok/s is the documented anchor (quiet "
            "machine), NOT measured in this run; target: >= 1.2x"
        )
    for recipe in engines:
        one = med[f"engine {recipe} x1"]
        for label in [f"x{n}" for n in CONCURRENCY[1:]] + ["x16 mixed"]:
            run = med[f"engine {recipe} {label}"]
            print(
                f"{recipe}: {label} aggregate = {run['aggregate_tps'] / one['decode_tps']:.2f}x "
                f"its batch-1 decode ({run['steady_tps'] / one['decode_tps']:.2f}x once all "
                f"are decoding, {run['steady_tps']:.0f} tok/s)"
            )


if __name__ == "__main__":
    main()
